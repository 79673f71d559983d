"""Orphans (the driver's subsystems no staging record claims) are released one at a time: a failed disconnect
neither stops the node's start nor the other releases; it is counted and tried again by the periodic pass."""

from __future__ import annotations

from pathlib import Path

from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.nvmeof.nqn import VOLUME_NQN_PREFIX as NQN_PREFIX
from nvmeof_csi.service.contracts import OrphanStats, VolumeRef
from tests.unit.test_connector import OTHER, VOL, connector, ctx


def test_one_failed_orphan_disconnect_does_not_stop_the_start_and_is_retried(tmp_path: Path) -> None:
    """Before, one failing ``nvme disconnect`` raised out of ``reconcile`` and the node plugin did not start; the
    orphans after it stayed connected. Now each subsystem is released on its own, the failure is counted and the
    node's periodic pass tries again."""
    conn, fake = connector(tmp_path)
    third = VolumeRef("store-a", "33333333-3333-4333-8333-333333333333")
    for ref in (VOL, OTHER, third):
        conn.connect(ref, ctx(ref), 30)
    stuck = NvmeSysfs(tmp_path).subsystem(ctx(OTHER)["nqn"])
    assert stuck is not None
    fake.failing_disconnects = {c.name for c in stuck.controllers}
    actions = conn.reconcile([(VOL, ctx(VOL))], 30)  # OTHER and third are orphans; OTHER's disconnect fails
    assert f"disconnected {NQN_PREFIX}{third.uuid}: no staged volume claims it" in actions
    assert any(a.startswith(f"could not disconnect {NQN_PREFIX}{OTHER.uuid} (retried later)") for a in actions)
    assert conn.find_device(third, ctx(third)) is None and conn.find_device(OTHER, ctx(OTHER)) is not None
    assert conn.orphan_stats() == OrphanStats(unreleased=1, failures=1)
    assert conn.retry_orphans([(VOL, ctx(VOL)), (OTHER, ctx(OTHER))]) == []  # claimed again: left alone
    assert conn.orphan_stats().unreleased == 0 and conn.find_device(OTHER, ctx(OTHER)) is not None
    conn.reconcile([(VOL, ctx(VOL))], 30)  # fails again
    fake.failing_disconnects.clear()
    assert conn.retry_orphans([(VOL, ctx(VOL))]) == [
        f"disconnected {NQN_PREFIX}{OTHER.uuid}: no staged volume claims it"
    ]
    assert conn.find_device(OTHER, ctx(OTHER)) is None
    assert conn.orphan_stats() == OrphanStats(unreleased=0, failures=2)
    assert conn.retry_orphans([(VOL, ctx(VOL))]) == []


def test_reconcile_never_disconnects_a_device_in_use(tmp_path: Path) -> None:
    """Before, reconciliation disconnected every unclaimed subsystem of ours, even one whose device was still
    mounted (a lost or quarantined staging record must not pull a filesystem from under a pod)."""
    busy: dict[str, str] = {}
    conn, _ = connector(tmp_path, busy=busy)
    device = conn.connect(OTHER, ctx(OTHER), 30)
    busy[device] = "mounted at /var/lib/kubelet/pods/x"
    actions = conn.reconcile([], 30)
    assert actions == [
        f"kept {NQN_PREFIX}{OTHER.uuid}: no staged volume claims it, but {device} mounted at /var/lib/kubelet/pods/x"
    ]
    assert conn.find_device(OTHER, ctx(OTHER)) == device
    busy.clear()
    assert conn.reconcile([], 30) == [f"disconnected {NQN_PREFIX}{OTHER.uuid}: no staged volume claims it"]
