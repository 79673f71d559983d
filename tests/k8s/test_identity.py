"""Each GPU node's and each agent's own identity, issued in the cluster (security round 2, point 2): the node
plugin and the agent asked for theirs with a CertificateSigningRequest and the controller's signer issued them
for this node's name and host NQN, and for this agent's name and address, only; a request either makes for
another node or agent, or for a host NQN or address that is not theirs, is denied with the reason, by the
real API server's user info (the pod-bound token's node claim).

The live limits scenario of ``test_kubernetes`` (the attributes class change) reads the agent with this
certificate: there is no shared node certificate and no agentAuthz entry for the node any more
(``ci/lab-values.yaml``)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography import x509

from lab.kube.cluster import DRIVER, NAMESPACE, KubeCluster
from lab.kube.layout import BY_NAME, GPUS, STORAGE
from nvmeof_csi.identity.certs import names_of, node_identity_of
from tests.support.kube import crictl, wait_for

pytestmark = pytest.mark.lab

SIGNER = "csi.nvmeof.io/node-client"
AGENT_SIGNER = "csi.nvmeof.io/agent-server"
PYTHON = "/opt/nvmeof-csi/bin/python"
AGENT = STORAGE  # the lab agent's name in ci/lab-values.yaml's fabric map (its node's name)
AGENT_IP = BY_NAME[STORAGE].node_ip  # where it serves: its node's address
NODE = GPUS[0]  # the GPU node whose node plugin is looked at
FOREIGN_NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000aa"
#: run in the node plugin's container, with its own service account token: ask for a (node, NQN) identity
ASK = """
import json, pathlib, sys, tempfile
from concurrent.futures import ThreadPoolExecutor
from nvmeof_csi.kube.api import api_client
from nvmeof_csi.issuance.certificate import IdentityCertificate, agent_identity, node_identity
from nvmeof_csi.issuance.checks import AGENT_SIGNER, NODE_SIGNER
from kubernetes.client import CertificatesV1Api
api = CertificatesV1Api(api_client(""))

def ask(kind, name, value):
    names = node_identity(name, value) if kind == "node" else agent_identity(name, value)
    signer = NODE_SIGNER if kind == "node" else AGENT_SIGNER
    cert = IdentityCertificate(api, pathlib.Path(tempfile.mkdtemp()), signer, names, wait=150)
    try:
        cert.ensure()
        return {"issued": True}
    except Exception as exc:
        return {"issued": False, "why": str(exc)}

asks = [sys.argv[i:i + 3] for i in range(1, len(sys.argv), 3)]
with ThreadPoolExecutor(len(asks)) as pool:
    print(json.dumps(list(pool.map(lambda a: ask(*a), asks))))
"""


#: run in the node plugin's container: the agent, reached with the node's own issued certificate
PROBE = """
import json, sys, time
from pathlib import Path
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles
own = Path("/var/lib/nvmeof-csi/node/identity")
target = AgentTarget("storage-1", Endpoint.parse(sys.argv[1]), TlsFiles(own / "tls.crt", own / "tls.key", Path("/tls/ca.crt")))
out = {"unanswered": []}
with AgentClient(target, 30) as agent:
    for _ in range(12):  # a connection the agent's start or restart broke is tried again, each failure kept
        try:
            out["health"] = bool(agent.health())
            break
        except Exception as exc:
            out["unanswered"].append(f"{type(exc).__name__}: {exc}"[:300])
            time.sleep(10)
    for what, call in (
        ("foreign_keys", lambda: agent.get_host_keys("00000000-0000-4000-8000-000000000001", sys.argv[2])),
        ("create", lambda: agent.create_volume("made-by-a-node", 1 << 20)),
    ):
        try:
            call()
            out[what] = "ALLOWED"
        except Exception as exc:
            out[what] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _exec(kube: KubeCluster, node: str, pod_prefix: str, container: str, *argv: str) -> str:
    pods = [p["metadata"]["name"] for p in kube.pods()
            if p["metadata"]["name"].startswith(pod_prefix) and p["spec"].get("nodeName") == node]  # fmt: skip
    assert len(pods) == 1, pods
    ids = crictl(
        kube, node, "ps", "-q", "--state", "Running", "--name", f"^{container}$",
        "--label", f"io.kubernetes.pod.name={pods[0]}", "--label", f"io.kubernetes.pod.namespace={NAMESPACE}",
    ).split()  # fmt: skip
    assert len(ids) == 1, f"{container} containers of {pods[0]}: {ids}"
    return crictl(kube, node, "exec", ids[0], *argv, timeout=300)  # on a busy emulated node a decision takes minutes


def _issued(kube: KubeCluster, signer: str, node: str) -> dict[str, Any]:
    """The first request of ``signer`` made from ``node`` and issued."""

    def issued() -> list[dict[str, Any]]:
        return [c for c in kube.cp.get("csr")["items"]
                if c["spec"]["signerName"] == signer and c.get("status", {}).get("certificate")
                and c["spec"]["extra"].get("authentication.kubernetes.io/node-name") == [node]]  # fmt: skip

    wait_for(f"an identity of {signer} issued", lambda: bool(issued()), 180)
    return issued()[0]


def _ask(
    kube: KubeCluster, node: str, pod_prefix: str, container: str, *asks: tuple[str, str, str]
) -> list[dict[str, object]]:
    """Each (kind, name, NQN or address) asked at once from the container on ``node``, with its own service
    account."""
    out = _exec(kube, node, pod_prefix, container, PYTHON, "-c", ASK, *(word for ask in asks for word in ask))
    answers: list[dict[str, object]] = json.loads(out.strip().splitlines()[-1])
    return answers


def _denied(kube: KubeCluster, signer: str) -> list[str]:
    return [c["metadata"]["name"] for c in kube.cp.get("csr")["items"] if c["spec"]["signerName"] == signer
            and any(k["type"] == "Denied" for k in c["status"].get("conditions", []))]  # fmt: skip


def test_the_node_has_its_own_identity_and_cannot_ask_for_another(kube: KubeCluster) -> None:
    nqn = next(d["nodeID"] for d in kube.cp.get("csinode", NODE)["spec"]["drivers"] if d["name"] == DRIVER)

    csr = _issued(kube, SIGNER, NODE)
    assert csr["spec"]["username"] == f"system:serviceaccount:{NAMESPACE}:nvmeof-csi-node", csr["spec"]
    assert csr["spec"]["extra"]["authentication.kubernetes.io/node-name"] == [NODE], csr["spec"]["extra"]
    conditions = {c["type"]: c for c in csr["status"]["conditions"]}
    assert conditions["Approved"]["reason"] == "IdentityChecked", conditions
    pem = base64.b64decode(csr["status"]["certificate"])
    assert node_identity_of(pem) == (NODE, nqn), x509.load_pem_x509_certificate(pem).subject

    denied = len(_denied(kube, SIGNER)), len(_denied(kube, AGENT_SIGNER))
    other, foreign, as_agent = _ask(
        kube, NODE, "nvmeof-csi-node-", "nvmeof-csi",
        ("node", GPUS[1], FOREIGN_NQN), ("node", NODE, FOREIGN_NQN),
        ("agent", AGENT, AGENT_IP),  # a GPU node posing as the agent
    )  # fmt: skip
    assert other["issued"] is False and f"requester runs on node '{NODE}'" in str(other["why"]), other
    assert foreign["issued"] is False and "is the node ID of no node" in str(foreign["why"]), foreign
    assert as_agent["issued"] is False and "not the agent" in str(as_agent["why"]), as_agent
    assert (len(_denied(kube, SIGNER)), len(_denied(kube, AGENT_SIGNER))) == (denied[0] + 2, denied[1] + 1)
    # the issued certificate at work against the real agent: this node, never another host's keys, never more
    probe = _exec(
        kube, NODE, "nvmeof-csi-node-", "nvmeof-csi", PYTHON, "-c", PROBE, f"tcp://{AGENT_IP}:9440", FOREIGN_NQN
    )
    seen = json.loads(probe.strip().splitlines()[-1])
    restarts = {p["metadata"]["name"]: [c.get("restartCount") for c in p["status"].get("containerStatuses", [])]
                for p in kube.pods()}  # fmt: skip
    assert seen.get("health") is True, (seen, restarts)
    assert "PermissionDenied" in seen["foreign_keys"] and "keys of its own host" in seen["foreign_keys"], seen
    assert f"CreateVolume needs role controller; client 'node:{NODE}'" in seen["create"], seen
    print(f"node {NODE}: identity issued for {nqn}; requests for {GPUS[1]}, a foreign NQN and an agent denied"
          f" (agent unanswered first: {seen['unanswered']}, restarts {restarts})")  # fmt: skip


def test_each_agent_serves_with_its_own_identity_and_cannot_ask_for_another(kube: KubeCluster) -> None:
    csr = _issued(kube, AGENT_SIGNER, STORAGE)
    assert csr["spec"]["username"] == f"system:serviceaccount:{NAMESPACE}:nvmeof-csi-agent", csr["spec"]
    assert names_of(base64.b64decode(csr["status"]["certificate"])) == (f"agent:{AGENT}", (), (AGENT_IP,))
    before = len(_denied(kube, AGENT_SIGNER))
    unknown, moved = _ask(
        kube, STORAGE, "nvmeof-csi-agent-", "agent", ("agent", "store-9", AGENT_IP), ("agent", AGENT, "10.0.2.99")
    )  # another agent's name; the lab agent's name at an address that is not its own
    assert unknown["issued"] is False and "'store-9' is not in the controller's fabric map" in str(unknown["why"])
    assert moved["issued"] is False and f"agent '{AGENT}' serves on {AGENT_IP}" in str(moved["why"]), moved
    assert len(_denied(kube, AGENT_SIGNER)) == before + 2
    print(f"agent {AGENT}: server identity issued for {AGENT_IP}; requests for another agent or address denied")


def _drivers(kube: KubeCluster, node: str) -> list[dict[str, Any]]:
    drivers: list[dict[str, Any]] = kube.cp.get("csinode", node)["spec"]["drivers"] or []
    return drivers


def _set_drivers(kube: KubeCluster, node: str, drivers: list[dict[str, Any]]) -> None:
    """The CSINode's drivers replaced, as its kubelet does (a driver's entry is immutable: removed, then added)."""
    others = [d for d in _drivers(kube, node) if d["name"] != DRIVER]
    for step in (others, drivers):
        patch = json.dumps([{"op": "replace", "path": "/spec/drivers", "value": step}])
        kube.kubectl("patch", "csinode", node, "--type=json", "-p", patch)


def test_a_node_that_claims_another_nodes_nqn_in_its_csinode_is_refused_its_identity(kube: KubeCluster) -> None:
    """Security round 3, point 3, on the real API server: gpu-2 (its kubelet may write its own CSINode) claims
    gpu-1's host NQN while gpu-1's plugin is away, and asks for gpu-1's NQN under its own name. Before the
    durable binding the signer saw one claimant, gpu-2, and issued it gpu-1's identity."""
    victim, attacker = GPUS[0], GPUS[1]
    _issued(kube, SIGNER, victim)  # its identity was issued: its NQN is bound to it
    saved = {n: _drivers(kube, n) for n in (victim, attacker)}
    nqn = next(d["nodeID"] for d in saved[victim] if d["name"] == DRIVER)
    bindings = kube.cp.get("configmap", "nvmeof-csi-identity-bindings", "-n", NAMESPACE).get("data") or {}
    assert any(json.loads(v).get("nqn") == nqn and json.loads(v)["node"] == victim for v in bindings.values()), bindings
    claimed = [{**d, "nodeID": nqn} if d["name"] == DRIVER else d for d in saved[attacker]]
    try:
        _set_drivers(kube, victim, [d for d in saved[victim] if d["name"] != DRIVER])  # deregistered
        _set_drivers(kube, attacker, claimed)
        (answer,) = _ask(kube, attacker, "nvmeof-csi-node-", "nvmeof-csi", ("node", attacker, nqn))
    finally:
        _set_drivers(kube, attacker, saved[attacker])
        _set_drivers(kube, victim, saved[victim])
    assert answer["issued"] is False and f"bound to node '{victim}' until" in str(answer["why"]), answer
    print(f"{attacker} claiming {victim}'s NQN in its CSINode: denied ({str(answer['why'])[:160]})")
