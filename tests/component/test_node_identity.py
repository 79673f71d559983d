"""Node identities issued by the node CA (the controller's signer), presented to a real agent over mutual TLS:
each is role node for its own host NQN only, and nothing the node CA signed is ever more than a node.

Before (main at 7a3e7af): the agent had no node CA; every GPU node presented one shared certificate, so each
could act as any node the policy named. Without ``--node-ca`` none of these certificates is accepted at all.
A grant records the host's Node (AllowHost ``node_name``): a certificate for the same host NQN issued to another
Node (after the first one's expired and its binding lapsed) gets nothing of the volume (before, it got its keys).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.errors import InvalidArgument, NotFound, PermissionDenied, Unavailable
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles
from tests.component.test_agent import MiB, free_port, mtls_args
from tests.component.test_agent_roles import NEIGHBOUR_NQN, NODE_NQN
from tests.support.agents import start_agent
from tests.support.node_ca import make_ca, node_pair, write_pair
from tests.support.pki import make_pki


def test_node_ca_identities_act_only_as_their_own_host(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", "n", ("ctrl",))
    ca = make_ca()
    node_ca = tmp_path / "node-ca.crt"
    node_ca.write_bytes(ca[0])
    policy = tmp_path / "authz.yaml"
    policy.write_text("clients:\n  - {identity: n-ctrl, role: controller}\n")
    port = free_port()
    running = start_agent(tmp_path, [*mtls_args(port, pki, policy), "--node-ca", str(node_ca)])
    endpoint = Endpoint.parse(f"tcp://127.0.0.1:{port}")
    folder = tmp_path / "ids"
    gpu1 = write_pair(folder, "gpu-1", node_pair(ca, "gpu-1", NODE_NQN))
    forged_ctrl = write_pair(folder, "forged", node_pair(ca, "gpu-1", NODE_NQN, common_name="n-ctrl"))
    other_ca = make_ca("someone else's CA")
    stranger = write_pair(folder, "stranger", node_pair(other_ca, "gpu-1", NODE_NQN))

    def as_(pair: tuple[Path, Path]) -> AgentClient:
        return AgentClient(AgentTarget("a", endpoint, TlsFiles(pair[0], pair[1], pki["ca.crt"])), 10)

    try:
        for host in (NODE_NQN, NEIGHBOUR_NQN):
            (tmp_path / "nvmet" / "hosts" / host).mkdir(parents=True)
            (tmp_path / "nvmet" / "hosts" / host / "dhchap_key").write_text("")
        with as_((pki["ctrl.crt"], pki["ctrl.key"])) as c:
            mine = c.create_volume("for-gpu-1", 8 * MiB, {"auth": "dhchap"})
            theirs = c.create_volume("for-gpu-2", 8 * MiB, {"auth": "dhchap"})
            c.allow_host(mine.uuid, NODE_NQN, node_name="gpu-1")
            c.allow_host(theirs.uuid, NEIGHBOUR_NQN)
            with pytest.raises(InvalidArgument, match="node_name 'GPU_1' must be a Kubernetes Node name"):
                c.allow_host(mine.uuid, NODE_NQN, node_name="GPU_1")
        with as_(gpu1) as c:
            assert c.get_host_keys(mine.uuid, NODE_NQN).dhchap_secret.startswith("DHHC-1:00:")
            assert [v.uuid for v in c.list_volumes()] == [mine.uuid]  # gpu-2's volume is not even listed
            with pytest.raises(PermissionDenied, match="keys of its own host"):
                c.get_host_keys(theirs.uuid, NEIGHBOUR_NQN)
            with pytest.raises(NotFound):
                c.get_volume(theirs.uuid)
            with pytest.raises(PermissionDenied, match="CreateVolume needs role controller; client 'node:gpu-1'"):
                c.create_volume("by-node", 8 * MiB)
        # gpu-1's host NQN, issued to gpu-2 (its CSINode claimed it once gpu-1's binding lapsed): not its volume
        rebound = write_pair(folder, "rebound", node_pair(ca, "gpu-2", NODE_NQN))
        with as_(rebound) as c:
            assert c.list_volumes() == []
            with pytest.raises(NotFound):
                c.get_host_keys(mine.uuid, NODE_NQN)
            with pytest.raises(NotFound):
                c.get_volume(mine.uuid)
        # the node CA signed a certificate named like the controller's policy identity: still never a controller
        with as_(forged_ctrl) as c, pytest.raises(PermissionDenied, match="not a node identity"):
            c.create_volume("by-forgery", 8 * MiB)
        # a node identity from any other CA does not even get through the handshake
        with as_(stranger) as c, pytest.raises(Unavailable):
            c.health()
    finally:
        running.proc.terminate()
        running.proc.wait(30)
