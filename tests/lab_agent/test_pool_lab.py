"""Pool exhaustion with real I/O (#55 point 12): an agent whose pool is a small XFS of its own (reflink, as
recommended: a snapshot costs nothing until its source is rewritten), a tenant's volume written through the
fabric, snapshotted and rewritten until the agent refuses the next snapshot; the refusal (RESOURCE_EXHAUSTED, the
pool's high-water mark) comes from what the filesystem really holds, not from provisioned sizes (the thin limit is
far above the pool), no new volume is made either, and another tenant's thin volume still takes writes with 0
errors and reads them back.

Without the mark (``LAB_POOL_HIGH_WATER=100``) the third snapshot is made, the rewrite behind it fills the
filesystem, and the writes fail with ENOSPC at the target (I/O errors on the host)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from lab import Fabric, LabVM
from lab.target import POOL_DIR, GuestTargetAgent
from tests.lab_agent.conftest import P1, P2

pytestmark = pytest.mark.lab
MiB = 1 << 20
IMAGE = "/scratch/tight-pool.img"
POOL_MIB, VOLUME_MIB, OTHER_WRITE_MIB, CYCLES = 320, 64, 24, 5  # an XFS of 320 MiB has 256 MiB of room
HIGH_WATER = os.environ.get("LAB_POOL_HIGH_WATER", "70")
DATA = ("/scratch/pool-a", "/scratch/pool-b", "/scratch/pool-b.back")
Reporter = Callable[[str, str], None]


@pytest.fixture
def tight(lab_vm: LabVM, fabric: Fabric) -> Iterator[GuestTargetAgent]:
    """An agent whose pool is an XFS of its own (loop-mounted), its high-water mark 70 % and its thin-provisioning
    limit 1 GiB; afterwards the pool is unmounted and everything wiped."""
    agent = GuestTargetAgent(
        lab_vm, [P1, P2], groups=["a", "b"],
        extra_args=["--pool-high-water", HIGH_WATER, "--capacity-limit", "1G"],
    )  # fmt: skip
    agent.wipe()
    lab_vm.check(["modprobe", "loop"], 60)
    lab_vm.check(["truncate", "-s", f"{POOL_MIB}M", IMAGE])
    lab_vm.check(["mkfs.xfs", "-q", "-f", IMAGE], 120)
    lab_vm.mkdir(POOL_DIR)
    lab_vm.check(["mount", "-o", "loop", IMAGE, POOL_DIR], 60)
    try:
        agent.start()
        yield agent
    finally:
        agent.stop()
        fabric.clear()
        lab_vm.run(["umount", POOL_DIR], 60)
        agent.wipe()
        lab_vm.run(["rm", "-f", IMAGE, *DATA], 30)


def used_percent(vm: LabVM) -> int:
    return int(vm.check(["df", "--output=pcent", POOL_DIR]).splitlines()[-1].strip().rstrip("%"))


def test_snapshots_and_rewrites_fill_the_pool_to_its_mark_and_another_tenant_still_writes(
    lab_vm: LabVM, fabric: Fabric, tight: GuestTargetAgent, report: Reporter
) -> None:
    vm, size = lab_vm, str(VOLUME_MIB * MiB)
    mine = tight.ops("create", "pvc-full", size, vm.hostnqn)
    other = tight.ops("create", "pvc-other", size, vm.hostnqn)
    fabric.connect(P1, mine["nqn"])
    fabric.connect(P2, other["nqn"])
    vm.check(["dd", "if=/dev/urandom", f"of={DATA[0]}", "bs=1M", f"count={VOLUME_MIB}"], 120)
    rewrite = ["dd", f"if={DATA[0]}", f"of={fabric.wait_head(mine['nqn'])}", "bs=1M", "oflag=direct"]
    vm.check(rewrite, 300)
    steps, refused = [used_percent(vm)], ""
    for cycle in range(CYCLES):  # a snapshot, then the volume rewritten: every cycle pins one more copy
        snap = tight.ops("attempt", "snapshot", f"full-{cycle}", mine["uuid"])
        if "refused" in snap:
            refused = snap["refused"]
            break
        wrote = vm.run(rewrite, 300)
        steps.append(used_percent(vm))
        assert wrote.rc == 0, f"rewrite {cycle} with the pool at {steps}% failed: {wrote.err.strip()[-200:]}"
    late = tight.ops("attempt", "create", "pvc-late", str(8 * MiB))
    vm.check(["dd", "if=/dev/urandom", f"of={DATA[1]}", "bs=1M", f"count={OTHER_WRITE_MIB}"], 120)
    head = fabric.wait_head(other["nqn"])
    wrote = vm.run(["dd", f"if={DATA[1]}", f"of={head}", "bs=1M", "oflag=direct", "conv=fsync"], 300)
    vm.check(["dd", f"if={head}", f"of={DATA[2]}", "bs=1M", f"count={OTHER_WRITE_MIB}", "iflag=direct"], 300)
    same = wrote.rc == 0 and vm.run(["cmp", DATA[1], DATA[2]], 60).rc == 0
    report(
        "pool exhaustion",
        f"{POOL_MIB} MiB XFS pool, mark {HIGH_WATER}%: used {steps}% after each snapshot and rewrite of the "
        f"{VOLUME_MIB} MiB volume; snapshot refused: {refused[:120]!r}; create: {str(late)[:80]!r}; the other "
        f"tenant's {OTHER_WRITE_MIB} MiB: rc {wrote.rc}, read back the same: {same}, pool {used_percent(vm)}%",
    )
    assert len(steps) >= 3, steps  # what the filesystem holds, not provisioned sizes, sets the limit
    assert refused.startswith("ResourceExhausted") and "high-water" in refused, refused
    assert str(late.get("refused", "")).startswith("ResourceExhausted"), late
    assert steps[-1] >= int(HIGH_WATER), steps
    assert wrote.rc == 0 and same, wrote.err
