"""Real NVMe-oF in the lab VM: kernel nvmet target, nvme-tcp/nvme-rdma initiator, native multipath, ANA,
failover under I/O with data verified, and a scratch disk that survives a power cycle."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from lab import Fabric, IoProbe, LabVM, Portal, lab_qemu_pids

pytestmark = pytest.mark.lab

NQN = "nqn.2026-11.io.nvmeof:vol:0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01"
P1 = Portal(1, "tcp", "127.0.0.1", 4420)
P2 = Portal(2, "tcp", "127.0.0.2", 4421)
MiB = 1 << 20
Reporter = Callable[[str, str], None]


@dataclass
class Target:
    nqn: str
    ns_uuid: str
    head: str
    size: int


def make_backing(vm: LabVM, name: str, size_mb: int) -> str:
    path = f"/scratch/{name}.img"
    vm.check(["truncate", "-s", f"{size_mb}M", path])
    return path


@pytest.fixture
def two_paths(fabric: Fabric, lab_vm: LabVM) -> Iterator[Target]:
    backing = make_backing(lab_vm, "mp", 256)
    ns_uuid = fabric.add_subsystem(NQN, backing, hosts=[lab_vm.hostnqn])
    for portal in (P1, P2):
        fabric.add_port(portal)
        fabric.link(portal.port_id, NQN)
    fabric.set_ana(1, "optimized")
    fabric.set_ana(2, "non-optimized")
    for portal in (P1, P2):
        fabric.connect(portal, NQN)
    fabric.wait_paths(NQN, live=2)
    head = fabric.head_device(NQN)
    assert head is not None
    yield Target(NQN, ns_uuid, head, 256 * MiB)


def test_boot_gives_a_stock_kernel_with_unique_host_identity(lab_vm: LabVM, fabric: Fabric, report: Reporter) -> None:
    report("boot-to-ready", f"{lab_vm.boot_seconds:.1f}s ({lab_vm.accel}, kernel {lab_vm.ready['kernel']})")
    assert lab_vm.ready["kernel"] == lab_vm.info.kernel_release
    nqn = lab_vm.read("/etc/nvme/hostnqn").strip()
    assert nqn == lab_vm.hostnqn and not nqn.endswith("00000000-0000-0000-0000-000000000000")
    assert lab_vm.read("/etc/nvme/hostid").strip() in nqn
    assert fabric.multipath_enabled()
    assert lab_vm.exists("/sys/kernel/config/nvmet/subsystems")
    assert "xfs" in lab_vm.check(["findmnt", "-n", "-o", "FSTYPE", "/scratch"])


def test_tcp_two_portals_are_one_multipath_head_device(lab_vm: LabVM, fabric: Fabric, two_paths: Target) -> None:
    paths = fabric.paths(NQN)
    assert sorted(p.address.split(",")[0] for p in paths) == ["traddr=127.0.0.1", "traddr=127.0.0.2"]
    assert {p.ana_state for p in paths} == {"optimized", "non-optimized"}
    heads = [d for d in lab_vm.listdir("/sys/block") if d.startswith("nvme") and "c" not in d[4:]]
    assert heads == [two_paths.head.removeprefix("/dev/")], "expected exactly one head device for two paths"
    dev = two_paths.head.removeprefix("/dev/")
    assert lab_vm.read(f"/sys/block/{dev}/uuid").strip() == two_paths.ns_uuid
    assert int(lab_vm.read(f"/sys/block/{dev}/size")) * 512 == two_paths.size
    lab_vm.check(["dd", "if=/dev/urandom", "of=/tmp/pat", "bs=1M", "count=8"])
    lab_vm.check(["dd", "if=/tmp/pat", f"of={two_paths.head}", "bs=1M", "oflag=direct"])
    lab_vm.check(["cmp", "-n", str(8 * MiB), "/tmp/pat", two_paths.head])


def test_host_not_on_the_allow_list_is_refused(lab_vm: LabVM, fabric: Fabric) -> None:
    backing = make_backing(lab_vm, "acl", 64)
    fabric.add_subsystem(NQN, backing, hosts=[lab_vm.hostnqn])
    fabric.add_port(P1)
    fabric.link(1, NQN)
    stranger = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
    res = lab_vm.run(
        ["nvme", "connect", "-t", "tcp", "-a", P1.traddr, "-s", str(P1.trsvcid), "-n", NQN, f"--hostnqn={stranger}"],
        timeout=60,
    )
    assert res.rc != 0
    assert fabric.head_device(NQN) is None
    assert lab_vm.read("/sys/kernel/config/nvmet/subsystems/" + NQN + "/attr_allow_any_host").strip() == "0"


def test_rdma_connect_over_soft_roce(lab_vm: LabVM, fabric: Fabric) -> None:
    backing = make_backing(lab_vm, "rdma", 64)
    fabric.add_subsystem(NQN, backing, hosts=[lab_vm.hostnqn])
    fabric.setup_rxe("rdum0", ["169.254.77.1"])
    rdma = Portal(3, "rdma", "169.254.77.1", 4420)
    fabric.add_port(rdma)
    fabric.link(3, NQN)
    fabric.connect(rdma, NQN)
    paths = fabric.wait_paths(NQN, live=1)
    assert [p.transport for p in paths] == ["rdma"]
    head = fabric.head_device(NQN)
    assert head is not None
    lab_vm.check(["dd", "if=/dev/urandom", "of=/tmp/rpat", "bs=1M", "count=4"])
    lab_vm.check(["dd", "if=/tmp/rpat", f"of={head}", "bs=1M", "oflag=direct"])
    lab_vm.check(["cmp", "-n", str(4 * MiB), "/tmp/rpat", head])


def test_ana_flip_under_io_loses_nothing(lab_vm: LabVM, fabric: Fabric, two_paths: Target, report: Reporter) -> None:
    probe = IoProbe(lab_vm, two_paths.head, seconds=9)
    time.sleep(3)
    fabric.set_ana(1, "inaccessible")
    result = probe.result()
    report("ANA optimized->inaccessible", result.line())
    assert result.errors == 0 and result.ios > 0, result.errlog
    assert {p.address.split(",")[0]: p.ana_state for p in fabric.paths(NQN)}["traddr=127.0.0.1"] == "inaccessible"
    assert result.ios_after_last_stall > 0


def test_port_removal_under_io_loses_nothing_and_path_returns(
    lab_vm: LabVM, fabric: Fabric, two_paths: Target, report: Reporter
) -> None:
    probe = IoProbe(lab_vm, two_paths.head, seconds=9)
    time.sleep(3)
    fabric.remove_port(1)
    result = probe.result()
    report("port 1 removed", result.line())
    assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog
    assert sum(p.state == "live" for p in fabric.paths(NQN)) == 1
    fabric.add_port(P1)
    fabric.link(1, NQN)
    fabric.wait_paths(NQN, live=2, timeout=30)


def test_all_paths_down_10s_then_restored(lab_vm: LabVM, fabric: Fabric, two_paths: Target, report: Reporter) -> None:
    probe = IoProbe(lab_vm, two_paths.head, seconds=22)
    time.sleep(3)
    outage = threading.Thread(target=fabric.all_paths_down, args=(NQN, [1, 2], 10.0))
    outage.start()
    outage.join()
    result = probe.result()
    report("all paths down 10 s", result.line())
    assert result.errors == 0, result.errlog
    assert result.max_gap_s >= 8.0, "I/O never stalled: the outage did not take the paths down"
    assert result.ios_after_last_stall > 0, "I/O did not resume after the paths came back"
    fabric.wait_paths(NQN, live=2, timeout=30)


def test_zz_reboot_keeps_the_scratch_disk(lab_vm: LabVM, fabric: Fabric, report: Reporter) -> None:
    payload = "".join(f"{i:08d}" for i in range(20000))
    lab_vm.write("/scratch/keep.txt", payload)
    lab_vm.check(["sync"])
    old_pid = lab_vm.proc.pid if lab_vm.proc else -1
    nqn_before = lab_vm.hostnqn
    seconds = lab_vm.reboot()
    report("reboot boot-to-ready", f"{seconds:.1f}s")
    assert old_pid not in lab_qemu_pids()
    assert lab_vm.ready["scratch"] == "mounted"  # not reformatted
    assert lab_vm.hostnqn == lab_vm.read("/etc/nvme/hostnqn").strip() == nqn_before  # identity kept
    got = lab_vm.read("/scratch/keep.txt")
    assert hashlib.sha256(got.encode()).hexdigest() == hashlib.sha256(payload.encode()).hexdigest()
    Fabric(lab_vm).load(rdma=True)
