"""Read-only hosts reach a volume only through its read-only subsystem (``agent/readonly.py``): the agent's
bookkeeping on a plain configfs tree, the kernel device commands against a fake executor, the controller's
publish context and the node's check of it. The kernel proof is ``tests/lab_agent/test_readonly_lab.py``."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from nvmeof_csi.agent.readonly import KernelReadOnlyDevices
from nvmeof_csi.agent.state import StateStore
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.errors import CommandError, FailedPrecondition, InvalidArgument
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.host.executor import Result
from nvmeof_csi.initiator.connector import _context
from nvmeof_csi.nvmeof.nqn import namespace_nguid, readonly_namespace_uuid, readonly_nqn, volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.topology.fabric_map import parse_fabric_map
from tests.support.agents import LocalAgent, make_agent, plain_configfs

WRITER = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000a1"
READER = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000b2"
MiB = 1 << 20


def ready_agent(tmp: Path) -> TargetAgent:
    agent = make_agent(tmp)
    agent.converge()
    return agent


def test_a_read_only_host_is_allowed_only_on_the_read_only_subsystem(tmp_path: Path) -> None:
    agent = ready_agent(tmp_path)
    vol = agent.create_volume("v", 8 * MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(vol.uuid, WRITER)
    agent.allow_host(vol.uuid, READER, readonly=True)
    tree = agent.nvmet.dump()
    main, ro = tree["subsystems"][volume_nqn(vol.uuid)], tree["subsystems"][readonly_nqn(vol.uuid)]
    assert main["hosts"] == [WRITER] and ro["hosts"] == [READER]
    ns = ro["namespaces"]["1"]
    assert ns["device_uuid"] == readonly_namespace_uuid(vol.uuid) != vol.uuid
    assert ns["device_nguid"] == namespace_nguid(readonly_namespace_uuid(vol.uuid)) and ns["enable"] == "1"
    assert all(readonly_nqn(vol.uuid) in port["subsystems"] for port in tree["ports"].values())
    assert agent.converge().applied == []  # what it made is what the state says

    agent.deny_host(vol.uuid, READER)
    assert readonly_nqn(vol.uuid) not in agent.nvmet.dump()["subsystems"]  # gone with its last host
    assert agent.nvmet.allowed_hosts(volume_nqn(vol.uuid)) == [WRITER]


def test_without_devices_a_read_only_grant_is_refused_before_anything_is_saved(tmp_path: Path) -> None:
    base = ready_agent(tmp_path)
    agent = TargetAgent(base.name, base.nvmet, base.store, base.state, base.portals)  # no readonly_devices
    vol = agent.create_volume("v", 8 * MiB, VolumeParameters.parse({}), {}).record
    with pytest.raises(FailedPrecondition, match="refuses writes"):
        agent.allow_host(vol.uuid, READER, readonly=True)
    assert agent.get_volume(vol.uuid).record.hosts == {}
    agent.allow_host(vol.uuid, WRITER)  # read-write grants are not affected


def test_converge_repairs_and_rebuilds_the_read_only_subsystem(tmp_path: Path) -> None:
    agent = ready_agent(tmp_path)
    vol = agent.create_volume("v", 8 * MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(vol.uuid, READER, readonly=True)
    agent.nvmet.deny(readonly_nqn(vol.uuid), READER)  # drift
    agent.nvmet.allow(volume_nqn(vol.uuid), READER)  # worse drift: the reader on the writable subsystem
    assert any("read-only" in a or "allowed hosts" in a for a in agent.converge().applied)
    assert agent.nvmet.allowed_hosts(volume_nqn(vol.uuid)) == []
    assert agent.nvmet.allowed_hosts(readonly_nqn(vol.uuid)) == [READER]

    shutil.rmtree(tmp_path / "nvmet")  # a reboot: configfs is empty
    plain_configfs(tmp_path / "nvmet")
    again = make_agent(tmp_path)
    assert again.state.current.volumes[vol.uuid].readonly_hosts == (READER,)
    again.converge()
    assert again.nvmet.allowed_hosts(readonly_nqn(vol.uuid)) == [READER]
    assert again.nvmet.allowed_hosts(volume_nqn(vol.uuid)) == []


def test_fencing_a_read_only_host_removes_it_from_the_read_only_subsystem(tmp_path: Path) -> None:
    agent = ready_agent(tmp_path)
    vol = agent.create_volume("v", 8 * MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(vol.uuid, WRITER)
    agent.allow_host(vol.uuid, READER, readonly=True)
    agent.fence_host(vol.uuid, READER, "NODE_OUT_OF_SERVICE", "")
    assert readonly_nqn(vol.uuid) not in agent.nvmet.dump()["subsystems"]
    assert agent.nvmet.allowed_hosts(volume_nqn(vol.uuid)) == [WRITER]


def test_deleting_a_volume_removes_its_read_only_subsystem(tmp_path: Path) -> None:
    agent = ready_agent(tmp_path)
    vol = agent.create_volume("v", 8 * MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(vol.uuid, READER, readonly=True)
    agent.delete_volume(vol.uuid)
    assert agent.nvmet.dump()["subsystems"] == {}
    assert dict(StateStore(tmp_path / "state").current.volumes) == {}


class DeviceKernel:
    """losetup/dmsetup/blockdev/modprobe as a fake executor: one loop and one map per backing file."""

    def __init__(self, flakey: bool = True) -> None:
        self.flakey = flakey
        self.argvs: list[list[str]] = []
        self.loops: dict[str, str] = {}
        self.maps: dict[str, str] = {}

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        check: bool = True,  # as the real executor
        stdin: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Result:
        argv = list(argv)
        self.argvs.append(argv)
        out, rc = "", 0
        if argv[0] == "modprobe" and not self.flakey:
            rc = 1
        elif argv[:2] == ["dmsetup", "info"]:
            out, rc = (self.maps[argv[-1]] + "\n", 0) if argv[-1] in self.maps else ("", 1)
        elif argv[:2] == ["dmsetup", "create"]:
            self.maps[argv[3]] = f"dm-{len(self.maps)}"
        elif argv[:2] == ["dmsetup", "remove"]:
            self.maps.pop(argv[-1])
        elif argv[0] == "losetup" and "--associated" in argv:
            out = self.loops.get(argv[-1], "")
        elif argv[0] == "losetup" and "--find" in argv:
            out = self.loops.setdefault(argv[-1], f"/dev/loop{len(self.loops)}")
        elif argv[0] == "losetup" and "--detach" in argv:
            self.loops = {k: v for k, v in self.loops.items() if v != argv[-1]}
        elif argv[0] == "blockdev":
            out = "16384"
        if check and rc:
            raise CommandError(argv, rc, "", "refused")
        return Result(rc, out, "")


def test_kernel_devices_make_a_write_refusing_map_once_and_remove_it(tmp_path: Path) -> None:
    kernel = DeviceKernel()
    devices = KernelReadOnlyDevices(kernel)
    backing = tmp_path / "vol.img"
    backing.write_bytes(b"")
    assert devices.attach("u1", backing) == "/dev/dm-0"
    create = next(a for a in kernel.argvs if a[:2] == ["dmsetup", "create"])
    assert create[-1] == "0 16384 flakey /dev/loop0 0 0 1 1 error_writes"
    assert ["losetup", "--find", "--show", "--direct-io=on", str(backing)] in kernel.argvs
    made = len(kernel.argvs)
    assert devices.attach("u1", backing) == "/dev/dm-0"  # idempotent: found, nothing made
    assert not any(a[:2] == ["dmsetup", "create"] for a in kernel.argvs[made:])
    devices.detach("u1", backing)
    assert kernel.maps == {} and kernel.loops == {}


def test_a_kernel_without_dm_flakey_is_a_failed_precondition_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="dm-flakey"):
        KernelReadOnlyDevices(DeviceKernel(flakey=False)).attach("u1", tmp_path / "vol.img")


def test_publish_read_only_names_the_read_only_subsystem_and_the_node_accepts_only_matching_pairs(
    tmp_path: Path,
) -> None:
    agent = ready_agent(tmp_path)
    fabric = parse_fabric_map({"agents": [{"name": "store-a", "endpoint": "unix:///nowhere", "fabric": "f1"}]})
    backend = AgentBackend(fabric, client=lambda _entry: LocalAgent(agent))
    vol = agent.create_volume("v", MiB, VolumeParameters.parse({}), {}).record
    ref = VolumeRef("store-a", vol.uuid)
    published = backend.publish(ref, READER, True)
    assert published["nqn"] == readonly_nqn(vol.uuid) and published["readonly"] == "true"
    assert "nqn" not in backend.publish(ref, WRITER, False)
    portals = {"portals": "tcp:127.0.0.1:4420"}
    assert _context(ref, {**portals, "nqn": published["nqn"], "namespaceUUID": published["namespaceUUID"]})
    assert _context(ref, {**portals, "nqn": volume_nqn(vol.uuid), "namespaceUUID": vol.uuid})
    with pytest.raises(InvalidArgument, match="does not belong"):  # a mixed pair is no volume's
        _context(ref, {**portals, "nqn": readonly_nqn(vol.uuid), "namespaceUUID": vol.uuid})
