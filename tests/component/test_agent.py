"""The agent process on the host (configfs replaced by a plain folder): its gRPC API over a unix socket,
mutual TLS on TCP, nvmeofctl against it, and the SIGKILL crash loop."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.cli.main import app as nvmeofctl
from nvmeof_csi.errors import ConfigError, DriverError, InvalidArgument, NotFound, Unavailable
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles
from tests.support.agents import Running, start_agent
from tests.support.pki import make_pki

HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"
MiB = 1 << 20
RESERVED = "5d0c9a1e-8f53-4b39-a3a2-0d9f7e0b1c01"


def mtls_args(port: int, pki: Mapping[str, Path], policy: Path) -> list[str]:
    """The agent's flags for mutual TLS on 127.0.0.1:``port`` with ``pki``'s server certificate and ``policy``."""
    tls = ["--tls-cert", str(pki["srv.crt"]), "--tls-key", str(pki["srv.key"]), "--tls-ca", str(pki["ca.crt"])]
    return ["--listen-tcp", f"tcp://127.0.0.1:{port}", *tls, "--authz-file", str(policy)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Running]:
    running = start_agent(tmp_path)
    yield running
    running.proc.terminate()
    assert running.proc.wait(30) == 0
    assert not Path(running.unix.removeprefix("unix://")).exists()


def client_for(running: Running) -> AgentClient:
    return AgentClient(AgentTarget("store-a", Endpoint.parse(running.unix)), 10)


def test_api_round_trip(agent: Running) -> None:
    with client_for(agent) as c:
        assert c.health().ready
        vol = c.create_volume("pvc-1", 8 * MiB, {"queueSize": "64"}, {"team": "ml"})
        assert c.create_volume("pvc-1", 8 * MiB, {"queueSize": "64"}, {"team": "ml"}).uuid == vol.uuid
        assert vol.nqn == f"nqn.2026-11.io.nvmeof:vol:{vol.uuid}" and vol.namespace_uuid == vol.uuid
        assert [p.trsvcid for p in vol.portals] == [4420, 4421] and vol.status == "ready"
        assert list(c.allow_host(vol.uuid, HOST).allowed_hosts) == [HOST]
        assert c.get_volume(name="pvc-1").uuid == vol.uuid
        snap = c.create_snapshot("s1", vol.uuid)
        clone = c.create_volume("clone", 8 * MiB, source_snapshot=snap.uuid)
        assert clone.source_snapshot_uuid == snap.uuid
        assert c.resize_volume(vol.uuid, 16 * MiB).capacity_bytes == 16 * MiB
        assert {p.group: p.ana_state for p in c.set_ana("b", "non-optimized")} == {
            "a": "optimized",
            "b": "non-optimized",
        }
        assert c.capacity()[0].provisioned_bytes == 32 * MiB  # 16 + the clone's 8 + the snapshot's 8
        with pytest.raises(NotFound):
            c.get_volume("00000000-0000-0000-0000-000000000000")
        with pytest.raises(InvalidArgument):
            c.create_volume("", MiB)
        with pytest.raises(InvalidArgument, match="'colour'"):  # parsed at the agent's edge, whoever sent it
            c.create_volume("pvc-colour", MiB, {"colour": "blue"})
        with pytest.raises(InvalidArgument, match="queueSize"):
            c.create_volume("pvc-deep", MiB, {"queueSize": "4096"})
        assert c.lookup_name("pvc-1") == pb.Reservation(name="pvc-1", volume_uuid=vol.uuid)  # a volume, no reservation
        kept = c.reserve_name("pvc-2", RESERVED, "store-a")
        assert c.reserve_name("pvc-2", vol.uuid, "store-b") == kept == c.lookup_name("pvc-2")  # the first one stays
        with pytest.raises(InvalidArgument, match="volume_uuid"):
            c.reserve_name("pvc-3", "../../x", "store-a")
        with pytest.raises(InvalidArgument, match="agent"):
            c.reserve_name("pvc-3", RESERVED, "store\x00a")
        assert c.create_volume("pvc-2", 8 * MiB, vol_uuid=RESERVED).uuid == RESERVED
        c.release_name("pvc-2", RESERVED)
        assert c.lookup_name("pvc-2") == pb.Reservation(name="pvc-2", volume_uuid=RESERVED)
        c.delete_volume(RESERVED)
        assert c.lookup_name("pvc-2") is None
        c.delete_volume(clone.uuid)
        c.delete_snapshot(snap.uuid)
        c.deny_host(vol.uuid, HOST)
        c.delete_volume(vol.uuid)
        assert c.list_volumes() == []


def test_secrets_never_reach_the_log(agent: Running, tmp_path: Path) -> None:
    with client_for(agent) as c:
        vol = c.create_volume("v", MiB)
        with pytest.raises(DriverError, match="DH-HMAC-CHAP"):
            c.allow_host(vol.uuid, HOST, "DHHC-1:00:TOPSECRETKEYMATERIAL:")
    assert "TOPSECRETKEYMATERIAL" not in (tmp_path / "agent.log").read_text()


def test_nvmeofctl_against_the_agent(agent: Running) -> None:
    runner = CliRunner()

    def ctl(*args: str) -> str:
        result = runner.invoke(nvmeofctl, ["--agent", agent.unix, "-o", "json", *args])
        assert result.exit_code == 0, result.output
        return result.output

    with client_for(agent) as c:
        vol = c.create_volume("pvc-9", 4 * MiB)
    rows = json.loads(ctl("volumes", "list"))
    assert [(r["name"], r["target"]) for r in rows] == [("pvc-9", "agent")]
    assert json.loads(ctl("volumes", "show", "pvc-9"))[0]["uuid"] == vol.uuid
    assert json.loads(ctl("hosts", "allow", vol.uuid, HOST))[0]["allowed_hosts"] == [HOST]
    states = {r["group"]: r["ana_state"] for r in json.loads(ctl("ana", "set", "a", "inaccessible"))}
    assert states == {"a": "inaccessible", "b": "optimized"}
    assert len(json.loads(ctl("portals", "list"))) == 2
    snap = json.loads(ctl("snapshots", "create", "snap-x", "--volume", vol.uuid))[0]
    assert json.loads(ctl("snapshots", "list"))[0]["uuid"] == snap["uuid"]
    ctl("snapshots", "delete", snap["uuid"])
    assert json.loads(ctl("health"))[0]["ready"] is True
    bad = runner.invoke(nvmeofctl, ["--agent", agent.unix, "ana", "set", "a", "sideways"])
    assert bad.exit_code == 2
    drained = ctl("storage", "drain", "agent", "--wait", "5")  # no replicated volume here: drained at once
    assert "agent: draining" in drained and "drained: it serves no replicated volume" in drained, drained
    with client_for(agent) as c:
        assert c.health().draining  # what the controller's failover pass reads
    assert "agent: not draining" in ctl("storage", "drain", "agent", "--undo")
    with client_for(agent) as c:
        assert not c.health().draining


def test_tcp_requires_mutual_tls(tmp_path: Path) -> None:
    good = make_pki(tmp_path / "pki", "good")
    evil = make_pki(tmp_path / "pki", "evil")
    port = free_port()
    policy = tmp_path / "authz.yaml"
    policy.write_text("clients:\n  - {identity: good-cli, role: admin}\n")
    running = start_agent(tmp_path, mtls_args(port, good, policy))
    try:
        endpoint = Endpoint.parse(f"tcp://127.0.0.1:{port}")
        ok = AgentTarget("a", endpoint, TlsFiles(good["cli.crt"], good["cli.key"], good["ca.crt"]))
        with AgentClient(ok, 10) as c:
            assert c.health().ready
        stranger = AgentTarget("a", endpoint, TlsFiles(evil["cli.crt"], evil["cli.key"], good["ca.crt"]))
        with AgentClient(stranger, 5) as c, pytest.raises(Unavailable):
            c.health()
        plaintext = AgentTarget("a", endpoint, allow_plaintext_loopback=True)
        with AgentClient(plaintext, 5) as c, pytest.raises(Unavailable):
            c.health()
        with pytest.raises(ConfigError, match="mutual TLS"):
            AgentTarget("a", endpoint)
    finally:
        running.proc.terminate()
        running.proc.wait(30)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--listen-tcp", "tcp://127.0.0.1:9"], "mutual TLS"),
        (["--listen-tcp", "tcp://0.0.0.0:9", "--allow-plaintext-loopback"], "loopback"),
        (["--portal", "1:tcp:127.0.0.1:4420", "--portal", "1:tcp:127.0.0.2:4421"], "unique"),
    ],
)
def test_unsafe_or_broken_settings_are_refused(tmp_path: Path, args: list[str], needle: str) -> None:
    base = [
        "agent",
        "--name",
        "a",
        "--state-dir",
        str(tmp_path / "s"),
        "--pool-dir",
        str(tmp_path / "p"),
        "--listen-unix",
        f"unix://{tmp_path}/a.sock",
    ]
    if "--portal" not in args:
        base += ["--portal", "1:tcp:127.0.0.1:4420"]
    proc = subprocess.run(
        [sys.executable, "-m", "nvmeof_csi", *base, *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_sigkill_crash_loop_ends_consistent(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.crashloop",
            str(tmp_path / "crash"),
            "--ops",
            "200",
            "--min-kills",
            "10",
            "--plain-tree",
            "--kill-every",
            "0.02",
            "0.15",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["kills"] >= 10 and report["interrupted_rpcs"] >= 1, report
    assert report["state_names"] == report["expected_names"]
    assert report["statuses"] in ([], ["ready"])
    assert report["subsystems_match"] and report["files_match"] and report["links_match"], report
    assert not report["restart_changed_configfs"] and report["corrupt"] == []


@pytest.mark.parametrize("field", ["absolute", "dotdot"])
def test_hostile_host_nqn_never_reaches_a_file_outside_configfs(agent: Running, tmp_path: Path, field: str) -> None:
    """Before request fields were validated, DenyHost joined the host NQN into a configfs path: an absolute
    value or ``../`` made the agent (root) unlink any file."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    hostile = str(victim) if field == "absolute" else "../../../victim"
    with client_for(agent) as c:
        vol = c.create_volume("pvc-h", 8 * MiB)
        with pytest.raises(InvalidArgument, match="host NQN"):
            c.deny_host(vol.uuid, hostile)
        with pytest.raises(InvalidArgument, match="host NQN"):
            c.allow_host(vol.uuid, hostile)
        for bad_uuid in ("../../victim", str(victim), vol.uuid.upper()):
            with pytest.raises(InvalidArgument, match="UUID"):
                c.delete_volume(bad_uuid)
        with pytest.raises(InvalidArgument, match="name"):
            c.create_volume("bad\x00name", 8 * MiB)
        assert c.get_volume(vol.uuid).status == "ready"
    assert victim.read_text() == "precious"


def test_listings_come_in_pages(agent: Running) -> None:
    from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
    from nvmeof_csi.gen import nvmeof_agent_pb2_grpc as pb_grpc

    with client_for(agent) as c:
        made = sorted(c.create_volume(f"page-{i}", 8 * MiB).uuid for i in range(5))
        for i, uuid in enumerate(made[:3]):
            c.create_snapshot(f"snap-{i}", uuid)
        assert [v.uuid for v in c.list_volumes()] == made  # the client walks every page
        assert len(c.list_snapshots()) == 3
    import grpc

    with grpc.insecure_channel(agent.unix) as channel:
        stub = pb_grpc.AgentStub(channel)
        first = stub.ListVolumes(pb.ListVolumesRequest(max_entries=2), timeout=10)
        assert [v.uuid for v in first.volumes] == made[:2] and first.next_token == made[1]
        rest = stub.ListVolumes(pb.ListVolumesRequest(max_entries=10, starting_token=first.next_token), timeout=10)
        assert [v.uuid for v in rest.volumes] == made[2:] and rest.next_token == ""
        with pytest.raises(grpc.RpcError) as info:
            stub.ListVolumes(pb.ListVolumesRequest(starting_token="../x"), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
