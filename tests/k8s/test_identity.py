"""Each GPU node's own identity towards the agents, issued in the cluster (security round 2, point 2): the
node plugin asked for it with a CertificateSigningRequest and the controller's signer issued it for this
node's name and host NQN only; a request the node plugin makes for another node, or for a host NQN that is not
its node's, is denied with the reason, by the real API server's user info (the pod-bound token's node claim).

The live limits scenario of ``test_kubernetes`` (test_7b) reads the agent with this certificate: there is no
shared node certificate and no agentAuthz entry for the node any more (``ci/lab-values.yaml``)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography import x509

from lab.kube.cluster import DRIVER, NAMESPACE, NODE, KubeCluster
from nvmeof_csi.identity.certs import node_identity_of
from tests.support.kube import crictl, wait_for

pytestmark = pytest.mark.lab

SIGNER = "csi.nvmeof.io/node-client"
PYTHON = "/opt/nvmeof-csi/bin/python"
#: run in the node plugin's container, with its own service account token: ask for a (node, NQN) identity
ASK = """
import datetime, json, pathlib, sys, tempfile
from nvmeof_csi.backends.kube_nodes import api_client
from nvmeof_csi.backends.node_certificate import NodeCertificate
from kubernetes.client import CertificatesV1Api
node, nqn = sys.argv[1], sys.argv[2]
cert = NodeCertificate(CertificatesV1Api(api_client("")), pathlib.Path(tempfile.mkdtemp()), node, nqn, wait=60)
try:
    cert.ensure()
    print(json.dumps({"issued": True}))
except Exception as exc:
    print(json.dumps({"issued": False, "why": str(exc)}))
"""


def _node_plugin_exec(kube: KubeCluster, *argv: str) -> str:
    pods = [p["metadata"]["name"] for p in kube.pods() if p["metadata"]["name"].startswith("nvmeof-csi-node-")]
    assert len(pods) == 1, pods
    ids = crictl(
        kube, "ps", "-q", "--state", "Running", "--name", "^nvmeof-csi$",
        "--label", f"io.kubernetes.pod.name={pods[0]}", "--label", f"io.kubernetes.pod.namespace={NAMESPACE}",
    ).split()  # fmt: skip
    assert len(ids) == 1, f"node plugin containers of {pods[0]}: {ids}"
    return crictl(kube, "exec", ids[0], *argv, timeout=180)


def test_the_node_has_its_own_identity_and_cannot_ask_for_another(kube: KubeCluster) -> None:
    nqn = next(d["nodeID"] for d in kube.cp.get("csinode", NODE)["spec"]["drivers"] if d["name"] == DRIVER)

    def issued() -> list[dict[str, Any]]:
        return [c for c in kube.cp.get("csr")["items"]
                if c["spec"]["signerName"] == SIGNER and c.get("status", {}).get("certificate")]  # fmt: skip

    wait_for("the node's identity issued", lambda: bool(issued()), 180)
    csr = issued()[0]
    assert csr["spec"]["username"] == f"system:serviceaccount:{NAMESPACE}:nvmeof-csi-node", csr["spec"]
    assert csr["spec"]["extra"]["authentication.kubernetes.io/node-name"] == [NODE], csr["spec"]["extra"]
    conditions = {c["type"]: c for c in csr["status"]["conditions"]}
    assert conditions["Approved"]["reason"] == "NodeIdentityChecked", conditions
    pem = base64.b64decode(csr["status"]["certificate"])
    assert node_identity_of(pem) == (NODE, nqn), x509.load_pem_x509_certificate(pem).subject

    def ask(node: str, host_nqn: str) -> dict[str, object]:
        out = _node_plugin_exec(kube, PYTHON, "-c", ASK, node, host_nqn)
        answer: dict[str, object] = json.loads(out.strip().splitlines()[-1])
        return answer

    other = ask("gpu-2", "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000aa")
    assert other["issued"] is False and f"requester runs on node '{NODE}'" in str(other["why"]), other
    foreign = ask(NODE, "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000aa")
    assert foreign["issued"] is False and "is the node ID of no node" in str(foreign["why"]), foreign
    denied = [c for c in kube.cp.get("csr")["items"] if c["spec"]["signerName"] == SIGNER and any(
        k["type"] == "Denied" for k in c["status"].get("conditions", []))]  # fmt: skip
    assert len(denied) == 2, [c["metadata"]["name"] for c in denied]
    print(f"node {NODE}: identity issued for {nqn}; requests for gpu-2 and for a foreign NQN denied")
