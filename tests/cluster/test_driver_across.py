"""The driver between machines (``lab/cluster_driver.py``): the agent on ``storage-1`` behind mutual TLS on the
management link, ``serve --mode all`` on ``gpu-1`` and ``gpu-2``, each driven by CSI calls in its own VM.
A read-only data set read on two nodes at once, a single-node volume moving from one node to the other (and
refused to the second while the first has it), a shared raw block volume written by both, and a node that lost a
link saying so while the other node reports the same volume healthy."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from lab import Fabric, GuestError, IoProbe, Portal
from lab.cluster_driver import ClusterDriver
from lab.fabric import wait_until
from tests.cluster.driving import OFF, UP, WORK, csi, files_sha256, on, uuid_of

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]
MiB = 1 << 20


def test_a_read_only_data_set_is_read_on_two_nodes_at_once_and_written_by_neither(stack: ClusterDriver) -> None:
    made = csi(stack, "gpu-1", *on("rox", *UP, size=128 * MiB), *on("rox", "write-dataset", files=16, kib=256))[0]
    data = f"{WORK}/rox/mount/dataset"
    written = files_sha256(stack, "gpu-1", data)
    csi(stack, "gpu-1", *on("rox", *OFF))
    before = stack.backing_sha256(uuid_of(made["volume_id"]))
    read_only = [*on("rox", "access", mode="MULTI_NODE_READER_ONLY"), *on("rox", "attach", "stage", "publish")]
    csi(stack, "gpu-1", *read_only)
    csi(stack, "gpu-2", *on("rox", "create", size=128 * MiB), *read_only)  # the same volume: CreateVolume by name
    for node in ("gpu-1", "gpu-2"):  # both nodes have it staged and published at once
        assert files_sha256(stack, node, data) == written, node
        denied = stack.cluster.vm(node).run(["dd", "if=/dev/zero", f"of={data}/new", "bs=4k", "count=1"])
        assert denied.rc != 0 and "Read-only file system" in denied.err, denied
    for node in ("gpu-1", "gpu-2"):
        csi(stack, node, *on("rox", *OFF))
    assert stack.backing_sha256(uuid_of(made["volume_id"])) == before  # not a byte written, not even the journal
    csi(stack, "gpu-1", *on("rox", "delete"))


def test_a_single_node_volume_moves_to_the_other_node_with_its_data_and_never_is_on_both(
    stack: ClusterDriver,
) -> None:
    made = csi(stack, "gpu-1", *on("mover", *UP, size=128 * MiB), *on("mover", "write-dataset", files=8, kib=512))[0]
    data = f"{WORK}/mover/mount/dataset"
    written = files_sha256(stack, "gpu-1", data)
    csi(stack, "gpu-1", *on("mover", "unpublish", "unstage"))  # still attached to gpu-1
    with pytest.raises(GuestError, match="FAILED_PRECONDITION"):
        csi(stack, "gpu-2", *on("mover", "create", "attach", size=128 * MiB))
    csi(stack, "gpu-1", *on("mover", "detach"))
    csi(stack, "gpu-2", *on("mover", "attach", "stage", "publish"))
    assert files_sha256(stack, "gpu-2", data) == written
    portal = Portal(9, "tcp", stack.cluster.address("storage-1", "fa"), 4420)
    with pytest.raises(GuestError):  # gpu-1 is no longer allowed by the target
        Fabric(stack.cluster.vm("gpu-1")).connect(portal, made["nqn"])
    csi(stack, "gpu-2", *on("mover", *OFF, "delete"))


def test_a_shared_raw_block_volume_is_written_by_both_nodes_and_each_reads_the_other(stack: ClusterDriver) -> None:
    """MULTI_NODE_MULTI_WRITER (live migration): each node writes its own 4 MiB region with O_DIRECT and reads
    the other's."""
    shared = [*on("shared", "access", mode="MULTI_NODE_MULTI_WRITER"), *on("shared", "attach", "stage", "publish")]
    made = csi(stack, "gpu-1", *on("shared", "create", size=64 * MiB, mode="block"), *shared)[0]
    csi(stack, "gpu-2", *on("shared", "create", size=64 * MiB, mode="block"), *shared)
    device = f"{WORK}/shared/device"
    digests = {}
    for region, node in enumerate(("gpu-1", "gpu-2")):
        vm = stack.cluster.vm(node)
        vm.check(["dd", "if=/dev/urandom", "of=/tmp/mine", "bs=1M", "count=4"])
        vm.check(["dd", "if=/tmp/mine", f"of={device}", "bs=1M", f"seek={4 * region}", "oflag=direct", "conv=fsync"])
        digests[node] = vm.check(["sha256sum", "/tmp/mine"]).split()[0]
    for node, (other, skip) in {"gpu-2": ("gpu-1", 0), "gpu-1": ("gpu-2", 4)}.items():
        vm = stack.cluster.vm(node)
        vm.check(["dd", f"if={device}", "of=/tmp/theirs", "bs=1M", f"skip={skip}", "count=4", "iflag=direct"])
        assert vm.check(["sha256sum", "/tmp/theirs"]).split()[0] == digests[other], (node, other)
    for node in ("gpu-2", "gpu-1"):
        csi(stack, node, *on("shared", *OFF))
    csi(stack, "gpu-1", *on("shared", "delete"))
    assert made["volume_id"]


def test_the_node_that_lost_a_link_says_so_while_the_other_node_reports_the_volume_healthy(
    stack: ClusterDriver, report: Reporter
) -> None:
    both = [*on("seen", "access", mode="MULTI_NODE_MULTI_WRITER"), *on("seen", "attach", "stage", "publish")]
    csi(stack, "gpu-1", *on("seen", "create", size=64 * MiB, mode="block"), *both)
    csi(stack, "gpu-2", *on("seen", "create", size=64 * MiB, mode="block"), *both)
    stack.cluster.black_hole("gpu-1", "fa")
    try:
        lost: dict[str, Any] = {}

        def noticed() -> bool:
            lost.update(csi(stack, "gpu-1", *on("seen", "health"))[0])
            return bool(lost["node"])

        assert wait_until(noticed, 120, 3), lost
        healthy = csi(stack, "gpu-2", *on("seen", "health"))[0]
    finally:
        stack.cluster.restore("gpu-1", "fa")
    report("NodeGetVolumeHealth on gpu-1 with link A black-holed", str(lost["node"]))
    assert any(stack.cluster.address("storage-1", "fa") in message for _, _, message in lost["node"]), lost
    assert healthy["node"] == [], healthy
    for node in ("gpu-2", "gpu-1"):
        csi(stack, node, *on("seen", *OFF))
    csi(stack, "gpu-1", *on("seen", "delete"))


def test_storage_losing_power_under_io_from_both_nodes_loses_nothing_once_it_is_back(
    stack: ClusterDriver, report: Reporter
) -> None:
    devices = {}
    for node in ("gpu-1", "gpu-2"):
        name = f"cut-{node}"
        csi(stack, node, *on(name, "create", "attach", "stage", "publish", size=128 * MiB, mode="block"))
        devices[node] = f"{WORK}/{name}/device"
    # O_DSYNC: the target advertises a volatile write cache, so only a write made durable (FUA) must survive the
    # cut; without it the last acknowledged writes may be lost, as on any device with such a cache
    probes = {node: IoProbe(stack.cluster.vm(node), dev, seconds=85, sync=True) for node, dev in devices.items()}
    time.sleep(5)
    stack.cluster.power_cut("storage-1")
    time.sleep(5)
    booted, started = stack.restart_storage()
    results = {node: probe.stop() for node, probe in probes.items()}  # the storage is back: no need to wait on
    for node, result in results.items():
        report(f"storage-1 power cut (boot {booted:.0f} s, agent {started:.0f} s): I/O on {node}", result.line())
        assert result.max_gap_s >= 10, "I/O never stalled: the power was not cut"
        assert result.errors == 0 and result.ios_after_last_stall > 0, (node, result.errlog)
    for node in ("gpu-1", "gpu-2"):
        csi(stack, node, *on(f"cut-{node}", *OFF, "delete"))
