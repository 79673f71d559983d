"""The node plugin on the real fabric, through CSI gRPC (``lab.csi_ops``) against ``serve --mode all --backend
nvmeof`` and our agent in the lab VM: failover under I/O on a staged *and published* volume, the node plugin
SIGKILLed mid-lifecycle, and unstaging one volume next to another that keeps doing I/O."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from lab import Fabric, IoProbe, LabVM
from lab.csi_ops import WORK as WORK_PATH
from lab.fabric import Portal, wait_until
from lab.probe import ProbeResult
from lab.stack import NODE_STATE, GuestDriver
from lab.target import POOL_DIR, TWO_PORTALS

pytestmark = pytest.mark.lab
MiB = 1 << 20
Reporter = Callable[[str, str], None]
P1, P2 = TWO_PORTALS
WORK_VOLUMES = str(WORK_PATH)


def live_paths(fabric: Fabric, nqn: str) -> int:
    return sum(p.state == "live" for p in fabric.paths(nqn))


def health(stack: GuestDriver, name: str) -> dict[str, list[list[str]]]:
    """Node and controller volume health of ``name``: {"node": [[status, reason, message], ...], "controller": ...}."""
    step = stack.one("health", name)
    return {"node": step["node"], "controller": step["controller"]}


HEALTHY: dict[str, list[list[str]]] = {"node": [], "controller": []}


def nvme_controllers(vm: LabVM) -> list[str]:
    return vm.listdir("/sys/class/nvme") if vm.exists("/sys/class/nvme") else []


def assert_all_released(stack: GuestDriver, nqn: str) -> None:
    vm = stack.vm
    assert stack.mounts() == [], "a mount was left behind"
    assert Fabric(vm).paths(nqn) == [], "a controller was left behind"
    assert vm.listdir(f"{NODE_STATE}/staging") == [], "a staging record was left behind"
    assert nqn not in vm.listdir("/sys/kernel/config/nvmet/subsystems"), "the target subsystem was not removed"


@pytest.fixture
def published(stack: GuestDriver) -> Iterator[dict[str, str]]:
    """A 256 MiB ext4 volume, staged and published through CSI, with a 16 MiB preallocated probe file."""
    steps = stack.csi(
        {"op": "up", "name": "fo", "size": 256 * MiB, "mode": "mount", "fs": "ext4"},
        {"op": "probe-target", "name": "fo", "mib": 16},
    )
    fabric = Fabric(stack.vm)
    nqn = steps[0]["nqn"]
    fabric.wait_paths(nqn, live=2)
    yield {"nqn": nqn, "probe": steps[1]["path"]}
    stack.csi({"op": "down", "name": "fo"})
    assert_all_released(stack, nqn)


def _under_probe(stack: GuestDriver, path: str, seconds: float, fault: Callable[[], None]) -> ProbeResult:
    probe = IoProbe(stack.vm, path, seconds=seconds)
    time.sleep(3)
    fault()
    return probe.stop()  # ends once its I/O has flowed again for a few seconds


def test_failover_suite_on_a_published_volume(stack: GuestDriver, published: dict[str, str], report: Reporter) -> None:
    # a black-holed path: between machines (tests/cluster/test_fabric_across.py) and, through the driver on a
    # published volume, by the bench tier's path-loss run (bench/pathloss.py fails on any I/O error)
    failover_suite(stack, published["nqn"], published["probe"], (P1, P2), None, report, "published volume", "fo")


def failover_suite(
    stack: GuestDriver,
    nqn: str,
    path: str,
    portals: tuple[Portal, Portal],
    blackhole: Callable[[bool], None] | None,
    report: Reporter,
    label: str,
    name: str,
) -> None:
    """ANA flip, portal removal (with the volume health it causes), a black-holed path (when ``blackhole`` can
    make one) and both paths down for 10 s, under a write+verify probe on ``path`` of volume ``name``: 0 errors,
    I/O resumes each time."""
    vm, (first, second) = stack.vm, portals
    fabric = Fabric(vm)
    longest: dict[str, float] = {}
    first_key = f"{first.traddr}:{first.trsvcid}"

    def check(name: str, result: ProbeResult) -> None:
        report(f"{label}: {name}", result.line())
        longest[name] = result.max_gap_s
        assert result.errors == 0, (name, result.errlog)
        assert result.ios > 0 and result.ios_after_last_stall > 0, (name, "I/O did not resume", result)

    def ana(portal: Portal) -> str:
        """What the host holds of the path to ``portal`` (its ``ana_state`` in sysfs)."""
        where = f"traddr={portal.traddr},trsvcid={portal.trsvcid}"
        return next((p.ana_state for p in fabric.paths(nqn) if f"{p.address},".startswith(f"{where},")), "no path")

    # 1. ANA: the optimized group becomes inaccessible (through our agent), then back; the host sees each change.
    before = (ana(first), ana(second))
    assert before[0] == "optimized", before
    result = _under_probe(stack, path, 9, lambda: stack.agent.ctl("ana", "set", "a", "inaccessible"))
    flipped = (ana(first), ana(second))
    check("ANA group a optimized->inaccessible", result)
    assert flipped == ("inaccessible", before[1]), (before, flipped)
    stack.agent.ctl("ana", "set", "a", "optimized")
    assert wait_until(lambda: ana(first) == "optimized", 30), ana(first)

    # 2. Portal removal: the subsystem leaves the first port; the volume's condition names the lost path.
    result = _under_probe(stack, path, 9, lambda: fabric.unlink(first.port_id, nqn))
    check(f"portal {first_key} removed", result)
    now = health(stack, name)  # CSI 1.13 volume health from both sides while the portal is gone
    report(f"{label}: volume health with one portal gone", f"node {now['node']}; controller {now['controller']}")
    assert [e[:2] for e in now["node"]] == [["DEGRADED", "PathsDown"]], now
    assert now["node"][0][2].startswith("1 of 2 paths live") and first_key in now["node"][0][2]
    assert [e[:2] for e in now["controller"]] == [["DEGRADED", "PortUnlinked"]], now
    fabric.link(first.port_id, nqn)
    fabric.wait_paths(nqn, live=2, timeout=60)
    assert wait_until(lambda: health(stack, name) == HEALTHY, 30), "not healthy after"

    # 3. A black-holed path (packets silently dropped): keep-alive (5 s) notices, I/O moves to the other path.
    if blackhole is not None:
        drop = blackhole
        result = _under_probe(stack, path, 26, lambda: drop(True))
        drop(False)
        check(f"path {first_key} black-holed", result)
        fabric.wait_paths(nqn, live=2, timeout=60)

    # 4. Both paths down for 10 s, then restored: I/O queues (no error) and resumes.
    outage = threading.Thread(target=fabric.all_paths_down, args=(nqn, [first.port_id, second.port_id], 10.0))
    result = _under_probe(stack, path, 22, outage.start)
    outage.join()
    check("both paths down 10 s", result)
    assert result.max_gap_s >= 8.0, "I/O never stalled: the outage did not take the paths down"
    fabric.wait_paths(nqn, live=2, timeout=60)

    after = health(stack, name)
    assert after == HEALTHY, after
    report("longest stall per scenario", ", ".join(f"{k}: {v:.3f}s" for k, v in longest.items()))


def test_node_plugin_sigkilled_between_stage_and_publish_and_after_publish(
    stack: GuestDriver, report: Reporter
) -> None:
    vm = stack.vm
    steps = stack.csi(
        {"op": "create", "name": "k", "size": 128 * MiB, "mode": "mount", "fs": "xfs"},
        {"op": "attach", "name": "k"},
        {"op": "stage", "name": "k"},
    )
    nqn = steps[0]["nqn"]
    Fabric(vm).wait_paths(nqn, live=2)
    controllers = nvme_controllers(vm)

    restart = stack.restart_after_kill()  # killed between Stage and Publish
    report("driver restart after SIGKILL (staged)", f"{restart:.1f}s")
    assert nvme_controllers(vm) == controllers, "restart must keep the staged volume's controllers"
    steps = stack.csi({"op": "publish", "name": "k"}, {"op": "write-dataset", "name": "k", "files": 16, "kib": 256})
    written = steps[1]["bytes"]

    restart = stack.restart_after_kill()  # killed after Publish
    report("driver restart after SIGKILL (published)", f"{restart:.1f}s")
    assert nvme_controllers(vm) == controllers
    steps = stack.csi(
        {"op": "verify-dataset", "name": "k"}, {"op": "stats", "name": "k"}, {"op": "publish", "name": "k"}
    )  # a repeated Publish changes nothing
    verify, stats = steps[0], steps[1]
    assert verify["mismatched"] == 0 and verify["bytes_verified"] == written, verify
    assert stats["usage"]["BYTES"]["used"] > 0, stats
    assert health(stack, "k") == HEALTHY
    assert len([m for m in stack.mounts() if m.endswith("/k/mount")]) == 1, stack.mounts()

    stack.csi({"op": "down", "name": "k"})
    assert_all_released(stack, nqn)
    assert nvme_controllers(vm) == []


def test_unstaging_one_volume_never_disconnects_another(stack: GuestDriver, report: Reporter) -> None:
    vm = stack.vm
    fabric = Fabric(vm)
    steps = stack.csi(
        {"op": "up", "name": "one", "size": 64 * MiB, "mode": "block"},
        {"op": "up", "name": "two", "size": 64 * MiB, "mode": "block"},
        {"op": "probe-target", "name": "two"},
    )
    nqn_one, nqn_two, device_two = steps[0]["nqn"], steps[1]["nqn"], steps[2]["path"]
    assert nqn_one != nqn_two
    fabric.wait_paths(nqn_one, live=2)
    fabric.wait_paths(nqn_two, live=2)
    probe = IoProbe(vm, device_two, seconds=14)
    time.sleep(2)
    stack.csi({"op": "down", "name": "one"})
    result = probe.result()
    report("volume two's I/O while volume one was unstaged", result.line())
    assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog
    assert fabric.paths(nqn_one) == []
    assert live_paths(fabric, nqn_two) == 2
    assert wait_until(lambda: health(stack, "two")["node"] == [], 30)
    stack.csi({"op": "down", "name": "two"})
    assert_all_released(stack, nqn_two)


def _mount_options(stack: GuestDriver, path: str) -> list[str]:
    for line in stack.vm.read("/proc/mounts").splitlines():
        fields = line.split()
        if fields[1] == path:
            return fields[3].split(",")
    raise AssertionError(f"{path} is not mounted")


def test_a_reader_only_volume_is_really_read_only(stack: GuestDriver, report: Reporter) -> None:
    """Before, a ReadOnlyMany volume was staged read-write (and its journal replayed), which corrupts ext4 and
    XFS that another node has mounted. Now: staged ``ro,noload`` and published read-only at two targets; writes
    fail with EROFS; not one byte of the volume changes."""
    vm = stack.vm
    created = stack.csi(
        {"op": "up", "name": "ro", "size": 64 * MiB, "mode": "mount", "fs": "ext4"},
        {"op": "write-dataset", "name": "ro", "files": 4, "kib": 256},
        {"op": "unpublish", "name": "ro"},
        {"op": "unstage", "name": "ro"},
        {"op": "detach", "name": "ro"},
    )
    nqn = created[0]["nqn"]
    backing = f"{POOL_DIR}/volumes/{nqn.rsplit(':', 1)[1]}.img"
    before = vm.check(["sha256sum", backing]).split()[0]
    steps = stack.csi(
        {"op": "access", "name": "ro", "mode": "MULTI_NODE_READER_ONLY"},
        {"op": "attach", "name": "ro"},
        {"op": "stage", "name": "ro"},
        {"op": "publish", "name": "ro"},
        {"op": "publish", "name": "ro", "target": f"{WORK_VOLUMES}/ro/b"},
        {"op": "verify-dataset", "name": "ro"},
    )
    assert steps[1]["publish_context"]["readonly"] == "true"
    staging, targets = f"{WORK_VOLUMES}/ro/staging", [steps[3]["target"], steps[4]["target"]]
    staged = set(_mount_options(stack, staging))
    assert "ro" in staged and staged & {"noload", "norecovery"}, staged  # the kernel shows noload as norecovery
    assert all("ro" in _mount_options(stack, t) for t in targets)
    for target in (staging, *targets):
        res = vm.run(["touch", f"{target}/new-file"], 30)
        assert res.rc != 0 and "Read-only file system" in res.err, (target, res.err)
    assert steps[5]["mismatched"] == 0 and steps[5]["files"] == 4
    stack.csi(
        {"op": "unpublish", "name": "ro", "target": targets[1]},
        {"op": "unpublish", "name": "ro"},
        {"op": "unstage", "name": "ro"},
        {"op": "detach", "name": "ro"},
    )
    after = vm.check(["sha256sum", backing]).split()[0]
    report(
        "read-only volume", f"ro,noload stage + 2 ro publishes, EROFS on write, sha256 {before[:12]} == {after[:12]}"
    )
    assert after == before, "a read-only stage changed the volume"
    stack.csi({"op": "delete", "name": "ro"})
    assert_all_released(stack, nqn)
