"""Agent roles from client certificates (mutual TLS on TCP): what each role may call, and a node that may
fetch only its own host's DH-HMAC-CHAP keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.errors import NotFound, PermissionDenied
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles
from tests.component.test_agent import MiB, free_port, mtls_args
from tests.support.agents import start_agent
from tests.support.pki import make_pki

NODE_NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000002"
NEIGHBOUR_NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000003"


def test_roles_from_client_certificates(tmp_path: Path) -> None:
    """Before, any certificate the CA signed could do everything (ANA flips, deletes, grants)."""
    pki = make_pki(tmp_path / "pki", "r", ("ctrl", "node", "reader", "ops", "stranger"))
    policy = tmp_path / "authz.yaml"
    policy.write_text(
        "clients:\n  - {identity: r-ctrl, role: controller}\n  - {identity: r-reader, role: reader}\n"
        f"  - {{identity: r-node, role: node, hostNqn: '{NODE_NQN}'}}\n  - {{identity: r-ops, role: admin}}\n"
    )
    port = free_port()
    running = start_agent(tmp_path, mtls_args(port, pki, policy))
    endpoint = Endpoint.parse(f"tcp://127.0.0.1:{port}")

    def as_(who: str) -> AgentClient:
        return AgentClient(
            AgentTarget("a", endpoint, TlsFiles(pki[f"{who}.crt"], pki[f"{who}.key"], pki["ca.crt"])), 10
        )

    try:
        assert oct(Path(running.unix.removeprefix("unix://")).stat().st_mode & 0o777) == "0o600"
        for host in (NODE_NQN, NEIGHBOUR_NQN):  # the attribute CONFIG_NVME_TARGET_AUTH gives a host entry
            (tmp_path / "nvmet" / "hosts" / host).mkdir(parents=True)
            (tmp_path / "nvmet" / "hosts" / host / "dhchap_key").write_text("")
        with as_("ctrl") as c:
            mine = c.create_volume("for-node", 8 * MiB, {"auth": "dhchap"})
            other = c.create_volume("not-for-node", 8 * MiB)
            c.allow_host(mine.uuid, NODE_NQN)  # the agent issues each host its own keys
            c.allow_host(mine.uuid, NEIGHBOUR_NQN)
            with pytest.raises(PermissionDenied, match="GetHostKeys needs role node"):
                c.get_host_keys(mine.uuid, NODE_NQN)  # the controller holds no key material
            with pytest.raises(
                PermissionDenied, match="SetAnaState needs role admin; client 'r-ctrl' has role controller"
            ):
                c.set_ana("a", "inaccessible")
        with as_("reader") as c:
            assert len(c.list_volumes()) == 2 and c.capacity()
            assert sorted(c.get_volume(mine.uuid).allowed_hosts) == sorted([NODE_NQN, NEIGHBOUR_NQN])
            with pytest.raises(PermissionDenied, match="CreateVolume needs role controller"):
                c.create_volume("nope", 8 * MiB)
            with pytest.raises(PermissionDenied, match="DenyHost needs role controller"):
                c.deny_host(mine.uuid, NODE_NQN)
            with pytest.raises(PermissionDenied, match="ReserveName needs role controller"):
                c.reserve_name("by-reader", mine.uuid, "a")
            assert c.lookup_name("for-node") is not None  # reading a name is a reader's
        with as_("node") as c:
            assert c.get_host_keys(mine.uuid, NODE_NQN).dhchap_secret.startswith("DHHC-1:00:")
            with pytest.raises(PermissionDenied, match="keys of its own host"):  # one node cannot act as another
                c.get_host_keys(mine.uuid, NEIGHBOUR_NQN)
            with pytest.raises(NotFound):
                c.get_host_keys(other.uuid, NODE_NQN)  # not allowed there: nothing issued
            assert [v.uuid for v in c.list_volumes()] == [mine.uuid]
            assert c.get_volume(mine.uuid).uuid == mine.uuid
            # its neighbour shares the volume: a node reads only its own host NQN there (before: both NQNs)
            assert list(c.get_volume(mine.uuid).allowed_hosts) == [NODE_NQN]
            assert [list(v.allowed_hosts) for v in c.list_volumes()] == [[NODE_NQN]]
            with pytest.raises(NotFound):
                c.get_volume(other.uuid)
            # a name that exists and one that does not read the same to a node (before: "no volume named ...")
            with pytest.raises(NotFound) as exists:
                c.get_volume(name="not-for-node")
            with pytest.raises(NotFound) as absent:
                c.get_volume(name="never-made")
            assert str(exists.value).replace("not-for-node", "X") == str(absent.value).replace("never-made", "X")
            with pytest.raises(PermissionDenied, match="ListSnapshots needs role reader"):
                c.list_snapshots()
        with as_("stranger") as c, pytest.raises(PermissionDenied, match="not in this agent's authz policy"):
            c.health()
        with as_("ops") as c:
            assert {p.ana_state for p in c.set_ana("a", "inaccessible")} >= {"inaccessible"}
        targets = tmp_path / "targets.yaml"
        targets.write_text(
            f"targets:\n  - name: a\n    endpoint: tcp://127.0.0.1:{port}\n    tls: {{cert: {pki['ctrl.crt']}, "
            f"key: {pki['ctrl.key']}, ca: {pki['ca.crt']}}}\n"
        )
        refused = subprocess.run(
            [sys.executable, "-m", "nvmeof_csi.cli.main", "--targets", str(targets), "ana", "set", "a", "optimized"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 1 and "SetAnaState needs role admin" in refused.stderr, refused.stderr
    finally:
        running.proc.terminate()
        running.proc.wait(30)
