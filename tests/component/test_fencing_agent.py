"""Fencing on the agent (configfs replaced by a plain folder, so what is observed is the agent's configfs calls):
the host leaves the allow-list, every port's link to the subsystem is dropped and made again (what ends live
controllers in nvmet), the fence is durable and idempotent, an agent killed between the grant's removal and the
teardown finishes it when it starts, and a fenced host cannot be allowed again until it is unfenced."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.pool import FileStore
from nvmeof_csi.agent.readonly import PlainReadOnlyDevices
from nvmeof_csi.agent.state import StateStore
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.cli.main import app as nvmeofctl
from nvmeof_csi.errors import FailedPrecondition, InvalidArgument
from nvmeof_csi.nvmeof.nqn import volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.rpc.endpoints import Endpoint
from tests.support.agents import PORTALS, plain_configfs, start_agent

GPU1 = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000a1"
GPU2 = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000a2"
BOOT = "5b1e2d3c-0000-4000-8000-000000000001"
MiB = 1 << 20


class SpyNvmet(Nvmet):
    """The plain-tree nvmet that records port link changes, and can die at the first unlink."""

    def __init__(self, root: Path, die_at_unlink: bool = False) -> None:
        super().__init__(plain_configfs(root), plain_tree=True)
        self.calls: list[tuple[str, int]] = []
        self.die_at_unlink = die_at_unlink

    def unlink(self, port_id: int, nqn: str) -> None:
        if self.die_at_unlink:
            raise SystemExit("killed between the grant's removal and the teardown")
        self.calls.append(("unlink", port_id))
        super().unlink(port_id, nqn)

    def link(self, port_id: int, nqn: str) -> None:
        self.calls.append(("link", port_id))
        super().link(port_id, nqn)


def agent_on(tmp: Path, nvmet: SpyNvmet, sleeps: list[float] | None = None) -> TargetAgent:
    slept = sleeps if sleeps is not None else []
    agent = TargetAgent(
        "store-a",
        nvmet,
        FileStore(tmp / "pool"),
        StateStore(tmp / "state"),
        PORTALS,
        sleep=slept.append,
        readonly_devices=PlainReadOnlyDevices(),
    )
    agent.converge()
    return agent


def test_a_fence_ends_the_hosts_grant_and_cycles_every_port_link_once(tmp_path: Path) -> None:
    nvmet, sleeps = SpyNvmet(tmp_path / "nvmet"), list[float]()
    agent = agent_on(tmp_path, nvmet, sleeps)
    vol = agent.create_volume("pvc-1", 8 * MiB, VolumeParameters.parse({"reconnectDelay": "3"}), {}).record
    agent.allow_host(vol.uuid, GPU1)
    agent.allow_host(vol.uuid, GPU2, readonly=True)
    nvmet.calls.clear()

    view = agent.fence_host(vol.uuid, GPU1, "NODE_OUT_OF_SERVICE", BOOT)
    assert set(view.record.hosts) == {GPU2} and GPU1 not in nvmet.allowed_hosts(volume_nqn(vol.uuid))
    assert nvmet.calls == [("unlink", 1), ("link", 1), ("unlink", 2), ("link", 2)]
    assert sleeps == [4.0]  # GPU2 remains: its reconnect delay (3 s) + 1 between the ports
    assert all(volume_nqn(vol.uuid) in nvmet.linked(p.port_id) for p in PORTALS)
    mark = view.record.fenced[GPU1]
    assert (mark["reason"], mark["boot_id"], mark["done"]) == ("NODE_OUT_OF_SERVICE", BOOT, True)

    nvmet.calls.clear()
    again = agent.fence_host(vol.uuid, GPU1, "NODE_CLEANUP_TIMEOUT")
    assert nvmet.calls == [] and again.record.fenced == view.record.fenced  # a done fence changes nothing

    with pytest.raises(FailedPrecondition, match="fenced"):
        agent.allow_host(vol.uuid, GPU1)
    agent.unfence_host(vol.uuid, GPU1)
    assert GPU1 in agent.allow_host(vol.uuid, GPU1).record.hosts


def test_a_fence_of_the_only_host_does_not_wait_between_ports(tmp_path: Path) -> None:
    sleeps: list[float] = []
    agent = agent_on(tmp_path, SpyNvmet(tmp_path / "nvmet"), sleeps)
    vol = agent.create_volume("pvc-1", 8 * MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(vol.uuid, GPU1)
    agent.fence_host(vol.uuid, GPU1, "NODE_OUT_OF_SERVICE")
    assert sleeps == []


def test_an_agent_killed_between_the_grant_and_the_teardown_finishes_the_fence_when_it_starts(
    tmp_path: Path,
) -> None:
    dying = SpyNvmet(tmp_path / "nvmet", die_at_unlink=True)
    agent = agent_on(tmp_path, dying)
    vol = agent.create_volume("pvc-1", 8 * MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(vol.uuid, GPU1)
    with pytest.raises(SystemExit):
        agent.fence_host(vol.uuid, GPU1, "NODE_OUT_OF_SERVICE", BOOT)

    restarted = SpyNvmet(tmp_path / "nvmet")
    again = TargetAgent(
        "store-a",
        restarted,
        FileStore(tmp_path / "pool"),
        StateStore(tmp_path / "state"),
        PORTALS,
        readonly_devices=PlainReadOnlyDevices(),
    )
    mark = again.get_volume(vol.uuid).record.fenced[GPU1]
    assert not mark["done"] and GPU1 not in again.get_volume(vol.uuid).record.hosts  # the grant went first
    again.converge()
    assert again.resume_fences() == [f"{vol.uuid}/{GPU1}"]
    assert restarted.calls == [("unlink", 1), ("link", 1), ("unlink", 2), ("link", 2)]
    assert again.get_volume(vol.uuid).record.fenced[GPU1]["done"]
    assert again.resume_fences() == []


def test_fence_input_is_checked(tmp_path: Path) -> None:
    agent = agent_on(tmp_path, SpyNvmet(tmp_path / "nvmet"))
    vol = agent.create_volume("pvc-1", 8 * MiB, VolumeParameters.parse({}), {}).record
    for reason, boot in (("", ""), ("x" * 65, ""), ("../etc", ""), ("NODE_OUT_OF_SERVICE", "not/a-boot-id")):
        with pytest.raises(InvalidArgument):
            agent.fence_host(vol.uuid, GPU1, reason, boot)


def test_fences_over_the_api_survive_an_agent_restart(tmp_path: Path) -> None:
    running = start_agent(tmp_path)
    target = AgentTarget("store-a", Endpoint.parse(running.unix))
    try:
        with AgentClient(target, 10) as c:
            vol = c.create_volume("pvc-1", 8 * MiB)
            c.allow_host(vol.uuid, GPU1)
            fenced = c.fence_host(vol.uuid, GPU1, "NODE_CLEANUP_TIMEOUT", BOOT)
            assert list(fenced.allowed_hosts) == []
            assert [(f.host_nqn, f.reason, f.boot_id, f.done) for f in fenced.fenced_hosts] == [
                (GPU1, "NODE_CLEANUP_TIMEOUT", BOOT, True)
            ]
    finally:
        running.proc.terminate()
        assert running.proc.wait(30) == 0
    running = start_agent(tmp_path)
    try:
        with AgentClient(target, 10) as c:
            assert [f.host_nqn for f in c.get_volume(vol.uuid).fenced_hosts] == [GPU1]
            with pytest.raises(FailedPrecondition, match="fenced"):
                c.allow_host(vol.uuid, GPU1)
            assert list(c.unfence_host(vol.uuid, GPU1).fenced_hosts) == []
            assert list(c.allow_host(vol.uuid, GPU1).allowed_hosts) == [GPU1]
    finally:
        running.proc.terminate()
        assert running.proc.wait(30) == 0


def test_only_a_controller_or_an_admin_may_fence() -> None:
    from nvmeof_csi.agent.authz import ALLOWED, CONTROLLER, NODE, READER

    for rpc in ("FenceHost", "UnfenceHost"):
        assert rpc in ALLOWED[CONTROLLER] and rpc not in ALLOWED[NODE] and rpc not in ALLOWED[READER]
    assert grpc.StatusCode.PERMISSION_DENIED  # the authorizer's refusal code (tests/component/test_agent.py)


def test_nvmeofctl_lists_fences_and_lifts_them(tmp_path: Path) -> None:
    running = start_agent(tmp_path)
    runner = CliRunner()

    def ctl(*args: str) -> str:
        result = runner.invoke(nvmeofctl, ["--agent", running.unix, "-o", "json", *args])
        assert result.exit_code == 0, result.output
        return result.output

    try:
        with AgentClient(AgentTarget("store-a", Endpoint.parse(running.unix)), 10) as c:
            vol = c.create_volume("pvc-9", 4 * MiB)
        ctl("hosts", "allow", vol.uuid, GPU1)
        assert [r["access"] for r in json.loads(ctl("hosts", "list", vol.uuid))] == ["read-write"]
        ctl("hosts", "fence", vol.uuid, GPU1)
        fenced = json.loads(ctl("hosts", "list", vol.uuid))
        assert [(r["host_nqn"], r["access"], r["reason"]) for r in fenced] == [(GPU1, "fenced", "OPERATOR")]
        assert fenced[0]["since"].endswith("Z")
        assert runner.invoke(nvmeofctl, ["--agent", running.unix, "hosts", "allow", vol.uuid, GPU1]).exit_code != 0
        ctl("hosts", "unfence", vol.uuid, GPU1)
        assert json.loads(ctl("hosts", "list", vol.uuid)) == []
        ctl("hosts", "allow", vol.uuid, GPU1)
    finally:
        running.proc.terminate()
        assert running.proc.wait(30) == 0
