"""Replication's fencing on the real kernel (#54, the mechanism the arbiter rests on): a DRBD 8.4 pair between
``storage-1`` and ``storage-2`` (``agent/drbd.py``, protocol C, ``fencing resource-and-stonith``), each node's
DRBD helper the agent's spool (``agent/fence_spool.py``).

1. The primary loses its peer (the storage-to-storage path black-holed, every other path up): its I/O freezes,
   the kernel's fence-peer call reaches the agent's spool, and a write stays pending until the agent answers;
   answered "peer outdated", the write completes and DRBD holds the peer Outdated.
2. The cut-off secondary is asked to become primary: DRBD itself asks the helper first, and answered "refused"
   the promotion fails: no replica is promoted without the arbiter's consent.

Without the mechanism (``LAB_DRBD_HELPER=default``: the module's own helper, ``/sbin/drbdadm``, which knows
nothing of the agent's resources) the first proof fails: the helper answers at once with a code DRBD counts as
broken, no request reaches the spool, and the write stays frozen."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from lab.build import LAB_DIR
from lab.cluster import LabCluster
from lab.fabric import wait_until
from lab.vm import LabVM
from nvmeof_csi.agent.drbd_config import DrbdSide, resource_text
from nvmeof_csi.agent.drbd_status import DrbdState, parse_proc_drbd
from nvmeof_csi.agent.fence_spool import PEER_FENCED, STAY_FROZEN

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]
SIDE = str(LAB_DIR / "guest" / "drbd_side.py")
PAIR = ("storage-1", "storage-2")
VOL = "5f0c2a6e-2d7b-4c59-9a83-0d6a1f2b7c11"
SECRET = "6e0f1c2b3a4d5e6f7a8b9c0d1e2f3a4b"
MINOR, PORT, MIB = 100, 7789, 64
SPOOL = "/run/nvmeof-drbd/spool"
DEVICE = f"/dev/drbd{MINOR}"


def side(vm: LabVM, *args: str, timeout: float = 120) -> dict[str, Any]:
    return both({vm: args}, timeout)[vm]


def both(calls: dict[LabVM, Sequence[str]], timeout: float = 120) -> dict[LabVM, dict[str, Any]]:
    """``drbd_side.py`` steps, one per machine, run at once (each start imports our code over the host share)."""
    started = {vm: vm.submit([vm.python, SIDE, *args], timeout=timeout) for vm, args in calls.items()}
    return {vm: json.loads(call.check().strip().splitlines()[-1]) for vm, call in started.items()}


def state(vm: LabVM) -> DrbdState | None:
    return parse_proc_drbd(vm.read("/proc/drbd")).get(MINOR)


def wait_state(vm: LabVM, what: str, ok: Callable[[DrbdState], bool], seconds: float = 120) -> DrbdState:
    if not wait_until(lambda: (s := state(vm)) is not None and ok(s), seconds, 0.5):
        raise AssertionError(f"{what}: /proc/drbd says {vm.read('/proc/drbd')}")
    found = state(vm)
    assert found is not None
    return found


def requests(vm: LabVM) -> list[str]:
    return [n for n in vm.listdir(SPOOL) if n.endswith(".req")]


@pytest.fixture(scope="module")
def pair(cluster: LabCluster) -> Iterator[tuple[LabVM, LabVM]]:
    """The pair Connected and UpToDate (a brand-new resource: its initial sync skipped), ``storage-1`` Primary."""
    one, two = (cluster.vm(n) for n in PAIR)
    default = ["--default-helper"] if os.environ.get("LAB_DRBD_HELPER") == "default" else []
    made = both({vm: ["prepare", SPOOL, *default, "--disk", VOL, str(MIB)] for vm in (one, two)})
    sides = tuple(DrbdSide(n, cluster.address(n, "fa"), PORT, made[cluster.vm(n)]["disk"]) for n in PAIR)
    text = resource_text(VOL, MINOR, (sides[0], sides[1]), SECRET, "/bin/false", "/bin/true")
    for vm in (one, two):
        vm.write("/run/nvmeof-drbd/pair.res", text)
    both({vm: ["up", VOL, SECRET, str(MINOR), "/run/nvmeof-drbd/pair.res"] for vm in (one, two)})
    wait_state(one, "connected", lambda s: s.connection == "Connected")
    side(one, "step", VOL, SECRET, "skip_initial_sync")
    wait_state(one, "both UpToDate", lambda s: s.in_sync)
    side(one, "step", VOL, SECRET, "promote")
    try:
        yield one, two
    finally:
        for vm in (one, two):
            for there in PAIR:
                vm.run(["ip", "route", "del", "blackhole", f"{cluster.address(there, 'fa')}/32"], 30)
            vm.run(["/usr/lib/drbd/drbdsetup-84", "resume-io", str(MINOR)], 30)
        downs = [vm.submit([vm.python, SIDE, "down", VOL, SECRET, str(MINOR)], 120) for vm in (one, two)]
        for call in downs:
            call.wait()


def cut_replication(cluster: LabCluster) -> None:
    """Only the storage-to-storage path: each side drops what it would send to the other's ``fa`` address."""
    for here, there in (PAIR, PAIR[::-1]):
        cluster.vm(here).check(["ip", "route", "add", "blackhole", f"{cluster.address(there, 'fa')}/32"])


def test_a_primary_cut_from_its_peer_writes_nothing_until_the_arbiter_answers_then_the_peer_is_outdated(
    cluster: LabCluster, pair: tuple[LabVM, LabVM], report: Reporter
) -> None:
    one, two = pair
    one.check(["dd", "if=/dev/urandom", f"of={DEVICE}", "bs=1M", "count=4", "oflag=direct"], 60)
    cut = time.monotonic()
    cut_replication(cluster)
    writer = one.submit(["dd", "if=/dev/urandom", f"of={DEVICE}", "bs=64k", "count=16", "seek=128", "oflag=direct"],
                        timeout=600)  # fmt: skip
    assert wait_until(lambda: bool(requests(one)), 120, 0.5), (
        f"no fence-peer request reached the agent's spool; /proc/drbd: {one.read('/proc/drbd')}"
    )
    asked = time.monotonic() - cut
    time.sleep(5)
    assert not writer.done(), "a write completed on a primary that lost its peer before the arbiter answered"
    frozen = state(one)
    assert side(one, "answer", SPOOL, str(PEER_FENCED))["answered"] == 1
    answered = time.monotonic()
    result = writer.wait(120)
    resumed = time.monotonic() - answered
    after = wait_state(one, "peer outdated", lambda s: s.peer_disk == "Outdated", 60)
    report("drbd: primary cut from its peer", f"fence-peer asked {asked:.1f}s after the cut; frozen state {frozen}; "
           f"write resumed {resumed:.1f}s after the answer (rc {result.rc}); then {after}")  # fmt: skip
    assert result.rc == 0, result.err
    assert after.role == "Primary" and after.disk == "UpToDate"
    assert requests(two) == []  # a secondary that loses its primary asks nothing


def test_a_cut_off_secondary_is_not_promoted_when_the_arbiter_refuses(
    pair: tuple[LabVM, LabVM], report: Reporter
) -> None:
    _, two = pair
    before = wait_state(two, "secondary cut off", lambda s: s.connection != "Connected", 60)
    promote = two.submit([two.python, SIDE, "step", VOL, SECRET, "promote"], timeout=300)
    assert wait_until(lambda: bool(requests(two)), 120, 0.5), "promoting a cut-off secondary asked nothing"
    assert not promote.done()
    assert side(two, "answer", SPOOL, str(STAY_FROZEN))["answered"] == 1
    refused = promote.wait(120)
    after = state(two)
    report("drbd: cut-off secondary asked to promote, arbiter refused", f"rc {refused.rc}; {before} -> {after}")
    assert refused.rc != 0 and after is not None and after.role == "Secondary", (refused.err, after)
