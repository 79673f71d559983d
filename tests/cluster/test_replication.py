"""A replicated volume through our agents on the real kernels (#54): one DRBD 8.4 pair (protocol C, ``fencing
resource-and-stonith``) between ``storage-1`` and ``storage-2``, each node's agent making its replica (loop, DRBD,
the namespace on ``/dev/drbdN``) and exposing the *same* subsystem with its own controller-ID window, ``gpu-1``
connected to both nodes' portals through one native multipath head. The test plays the controller: it gives roles
in epochs (``SetReplicaRole``) and answers DRBD's fence-peer calls (``AnswerFenceRequest``) as the arbiter would.

1. One volume, one subsystem on the host with every path of both nodes, only the primary presenting the
   namespace, no cntlid clash.
2. Only the replication link cut: the primary's writes freeze until the arbiter answers; the arbiter fences the
   cut-off secondary (its disk Outdated) and lets the primary go on; the outdated replica cannot be promoted; the
   link healed, only what changed meanwhile is resynced; 0 I/O errors, every acknowledged write reads back.
   Before the heal, storage-1 is forced Primary by hand and written (a split brain): DRBD connects neither; the
   controller's resolution (the record's primary wins: storage-1 ``discard``, storage-2 connects) resyncs
   storage-1, whose own writes are gone.
   Cut again and fenced at once, before its own ping timeout showed it the cut, it is outdated all the same.
3. The primary powered off mid-write: the survivor is promoted once the arbiter fences the dead node, the host's
   head picks its path up, 0 I/O errors, every acknowledged write reads back from the survivor (O_DIRECT).
4. The old primary returns (a Secondary after its reboot, made secondary): DRBD resyncs it from the new one,
   both replicas' data the same. A planned switchover there and back under the writer (``handover``, the peer
   promoted, ``secondary``; what the controller does for ``nvmeofctl storage drain``): 0 I/O errors, every
   acknowledged write reads back, neither disk outdated. Then the primary is cut from its peer while the arbiter does not answer it (a partition of
   the primary from peer and controller; gpu-1 reaches both): its I/O stays frozen, it unlinks its portals
   after ``--self-fence-after``, the arbiter promotes the peer, 0 I/O errors, every acknowledged write reads
   back (so the old primary acknowledged nothing the new one lacks).

Without the mechanism the proofs fail: with the module's own helper (``LAB_DRBD_HELPER=default``, DRBD's
``/sbin/drbdadm``, which knows nothing of the agent's resources) no fence-peer call reaches the agent and the
primary's writes stay frozen (2); with one cntlid window on both nodes (``LAB_CNTLID=same``) the host refuses the
second node's controllers ("Duplicate cntlid") and has no path to fail over to (1, 3)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

from lab.build import REPO
from lab.cluster import LabCluster
from lab.cluster_driver import CNTLID_WINDOWS, SELF_FENCE_AFTER, ClusterDriver, portals
from lab.fabric import Fabric, wait_until
from lab.target import AGENT_SOCK, GuestTargetAgent
from tests.cluster.replica_pair import (
    MIB,
    NQN,
    VOL,
    Pair,
    checksum,
    cut_replication,
    node_of,
    rogue_region,
    spec,
    split_brain,
    switch,
    writer,
    written_and_read_back,
)

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]


@pytest.fixture(scope="module")
def pair(cluster: LabCluster, stack: ClusterDriver) -> Iterator[Pair]:
    """The replica pair made by both agents (``storage-2`` primary, epoch 1) and ``gpu-1`` on all four paths."""
    # the hand-made fabric tests clear storage-1's configfs under the running agent (its portals too): a restart
    # converges it back to the agent's state, as its service manager's restart would
    stack.agent.stop("TERM")
    stack.agent.start()
    window = CNTLID_WINDOWS["storage-1" if os.environ.get("LAB_CNTLID") == "same" else "storage-2"]
    two = cluster.vm("storage-2")
    peer = GuestTargetAgent(
        two, portals(cluster, "storage-2"), name="storage-2", groups=["a", "b"],
        extra_args=["--replication-address", cluster.address("storage-2", "fa"), "--cntlid-window", window,
                    "--self-fence-after", SELF_FENCE_AFTER],
    )  # fmt: skip
    peer.wipe()
    peer.start()
    if os.environ.get("LAB_DRBD_HELPER") == "default":
        for name in ("storage-1", "storage-2"):  # DRBD's own helper: what the failing run of proof 2 uses
            cluster.vm(name).write("/sys/module/drbd/parameters/usermode_helper", "/sbin/drbdadm")
    gpu = cluster.vm("gpu-1")
    agents = {"storage-1": stack.agent, "storage-2": peer}
    made = [
        agent.vm.submit([agent.vm.python, "-m", "lab.agent_ops", AGENT_SOCK, "replica", "r",
                         str(MIB << 20), VOL, spec(cluster, name, other), gpu.hostnqn], timeout=300, cwd=str(REPO))
        for (name, agent), other in zip(agents.items(), ("storage-2", "storage-1"), strict=True)
    ]  # fmt: skip  # both replicas made at once (each guest's Python start costs seconds under TCG)
    for call in made:
        call.check()
    state = Pair(cluster, agents, head="")
    state.wait("storage-2", "connected, both Inconsistent", lambda r: r.get("connection") == "Connected")
    promoted = agents["storage-2"].ops("role", VOL, "primary", "1")
    assert "volume" in promoted, promoted
    fabric = Fabric(gpu)
    for node in ("storage-2", "storage-1"):
        for portal in portals(cluster, node):
            fabric.connect(portal, NQN, ctrl_loss_tmo=120)
    state.head = fabric.wait_head(NQN, 60)
    try:
        yield state
    finally:
        for name, agent in agents.items():  # a frozen replica resumes (its calls answered) so that it can go
            if name != state.dead:
                agent.ops("answer", VOL, "fenced")
        fabric.disconnect_all()
        if not state.dead:
            cut_replication(cluster, on=False)
        for name, agent in agents.items():
            if name != state.dead:
                agent.ops("delete", VOL)
        if state.dead != "storage-2":
            peer.stop()
            peer.wipe()


def test_one_volume_on_two_nodes_is_one_subsystem_with_both_nodes_paths(pair: Pair, report: Reporter) -> None:
    fabric = Fabric(pair.vm("gpu-1"))
    paths = fabric.wait_paths(NQN, live=4, timeout=60)
    gpu = pair.vm("gpu-1")
    cntlids = sorted(int(gpu.read(f"/sys/class/nvme/{p.controller}/cntlid")) for p in paths)
    presenting = sorted(node_of(pair.cluster, p.address) for p in paths if p.ana_state)
    report("replica pair: host view", f"paths {[(p.address, p.ana_state) for p in paths]}; cntlids {cntlids}")
    assert len({gpu.read(f"/sys/class/nvme/{p.controller}/subsysnqn").strip() for p in paths}) == 1
    assert sum(c < 1000 for c in cntlids) == 2 and sum(c >= 1000 for c in cntlids) == 2, cntlids
    assert presenting == ["storage-2", "storage-2"], paths  # only the primary's paths have the namespace
    assert pair.get("storage-2")["drbd_role"] == "Primary" and pair.get("storage-1")["drbd_role"] == "Secondary"
    log = gpu.check(["dmesg"], 30)
    assert "Duplicate cntlid" not in log and "IDs don't match" not in log
    copied_and_grown(pair, report)


def copied_and_grown(pair: Pair, report: Reporter) -> None:
    """A snapshot is taken on the Secondary in step with its primary; then the volume grows as the controller
    grows a pair (the Secondary's file, then the Primary's, whose agent runs ``drbdadm resize`` and waits for
    its peer's answer) and the host sees the new size on its one head."""
    one = pair.agents["storage-1"]
    made = one.ops("attempt", "snapshot", "snap-r", VOL)
    assert "made" in made, made
    one.ops("unsnap", made["made"]["uuid"])
    block = pair.head.removeprefix("/dev/")
    before = int(pair.vm("gpu-1").read(f"/sys/block/{block}/size")) * 512
    grown = (MIB + 16) << 20
    for node in ("storage-1", "storage-2"):
        assert int(pair.agents[node].ops("resize", VOL, str(grown))["capacity_bytes"]) == grown, node
    seen = wait_until(lambda: int(pair.vm("gpu-1").read(f"/sys/block/{block}/size")) * 512 >= grown, 60, 1.0)
    after = int(pair.vm("gpu-1").read(f"/sys/block/{block}/size")) * 512
    synced = pair.wait("storage-1", "the new end resynced",
                       lambda r: r.get("disk") == "UpToDate" and r.get("connection") == "Connected", 120)  # fmt: skip
    report("replica pair: snapshot and growth", f"snapshot on the Secondary made; host's head {before} -> {after} "
           f"bytes (asked {grown}); storage-1 {synced.get('disk')}/{synced.get('connection')}")  # fmt: skip
    assert seen and before < grown <= after, (before, after)


def test_a_primary_cut_from_its_peer_goes_on_only_when_the_arbiter_fenced_the_peer(
    pair: Pair, report: Reporter
) -> None:
    probe = writer(pair, 70)
    time.sleep(8)
    cut = time.monotonic()
    cut_replication(pair.cluster, on=True)
    two = pair.agents["storage-2"]
    spool = "/run/nvmeof-csi/drbd/spool"
    asked = wait_until(lambda: any(n.endswith(".req") for n in two.vm.listdir(spool)), 90, 0.5)
    assert asked, f"no fence-peer call reached storage-2's agent; storage-2: {pair.get('storage-2')}"
    waited = time.monotonic() - cut  # the writes stay frozen from here until the arbiter answers
    fenced = pair.role("storage-1", "fenced")  # the arbiter outdates the cut-off replica, then lets the primary on
    assert "volume" in fenced, fenced
    assert two.ops("answer", VOL, "fenced")["answered"] == 1
    answered = time.monotonic() - cut
    one_now = pair.get("storage-1")
    assert one_now["disk"] == "Outdated", one_now
    refused = pair.role("storage-1", "primary", "refused")
    assert "FailedPrecondition" in refused.get("refused", ""), refused
    behind = pair.wait("storage-2", "writes on, peer outdated", lambda r: r.get("peer_disk") == "Outdated", 60)
    time.sleep(5)
    dirty = pair.get("storage-2").get("out_of_sync_bytes", "0")
    split_brain(pair)  # and storage-1 changed too, by hand: the heal finds a split brain
    cut_replication(pair.cluster, on=False)
    healed = time.monotonic()
    brain = {n: pair.wait(n, "a split brain", lambda r: r.get("connection") == "StandAlone", 90)["connection"]
             for n in ("storage-1", "storage-2")}  # fmt: skip
    assert "volume" in pair.role("storage-1", "discard")  # as the controller's failover pass directs it
    assert "volume" in pair.role("storage-2", "primary")  # its StandAlone side connects again
    pair.wait("storage-1", "resynced", lambda r: r.get("disk") == "UpToDate" and r.get("connection") == "Connected",
              180)  # fmt: skip
    resync = time.monotonic() - healed
    rogue = rogue_region(pair, "storage-1") == rogue_region(pair, "storage-2")
    recut, resync2 = fence_before_it_sees_the_cut(pair)
    assert "volume" in pair.role("storage-1", "secondary")
    result, back = written_and_read_back(pair, probe)
    report(
        "replica pair: replication link cut",
        f"fence-peer asked {waited:.1f}s after the cut, answered at {answered:.1f}s; writer {result.line()}; "
        f"peer then {behind.get('peer_disk')}; {int(dirty) >> 10} KiB out of sync resynced in {resync:.1f}s "
        f"(of {MIB} MiB); outdated promotion: {refused.get('refused', '')[:120]}; read back {back.line()}; "
        f"fenced before it saw a second cut: {recut}, resynced in {resync2:.1f}s; split brain {brain}, resolved "
        f"as the record says: storage-1's forced writes gone: {rogue}",
    )
    assert rogue, "storage-1's own changes survived the split brain's resolution"
    assert result.io_errors == 0 and back.verify_errors == 0, (result.errlog, back.errlog)
    assert result.max_gap_s >= 5, "a write completed while the arbiter had not answered"
    assert 0 < int(dirty) < (MIB << 20) // 4, dirty


def fence_before_it_sees_the_cut(pair: Pair) -> tuple[str, float]:
    """The link cut again and the arbiter fencing storage-1 at once, before storage-1's own ping timeout has
    shown it the cut (the race a slow peer loses): DRBD refuses to outdate a disk it believes connected, so the
    agent cuts the connection hard, outdates the disk and lets it reconnect. storage-2's fence-peer call is
    answered, the link healed, and the outdated side comes back as a resync target. Gives storage-1's state
    before and after the fence, and the seconds from the heal to UpToDate."""
    two, spool = pair.agents["storage-2"], "/run/nvmeof-csi/drbd/spool"
    cut_replication(pair.cluster, on=True)
    before = pair.get("storage-1")
    assert before["connection"] == "Connected", before  # not seen yet: the case this proves
    assert "volume" in pair.role("storage-1", "fenced")
    after = pair.get("storage-1")
    assert after["disk"] == "Outdated", after  # before the fix: still UpToDate, and DRBD would promote it
    asked = wait_until(lambda: any(n.endswith(".req") for n in two.vm.listdir(spool)), 90, 0.5)
    assert asked and two.ops("answer", VOL, "fenced")["answered"] == 1
    cut_replication(pair.cluster, on=False)
    healed = time.monotonic()
    pair.wait("storage-1", "resynced after the fence", lambda r: r.get("disk") == "UpToDate", 180)
    seen = f"{before['disk']}/{before['connection']} -> {after['disk']}/{after['connection']}"
    return seen, time.monotonic() - healed


def test_the_primary_powered_off_mid_write_loses_nothing_acknowledged(pair: Pair, report: Reporter) -> None:
    probe = writer(pair, 75)
    time.sleep(8)
    pair.cluster.power_cut("storage-2")
    pair.dead, off = "storage-2", time.monotonic()
    lost = pair.wait("storage-1", "peer lost", lambda r: r.get("connection") != "Connected", 90)
    detected = time.monotonic() - off
    promoted = pair.role("storage-1", "primary", "fenced")  # the arbiter: storage-2 is down, fence it
    assert "volume" in promoted, promoted
    up = time.monotonic() - off
    result, back = written_and_read_back(pair, probe)
    report(
        "replica pair: primary powered off",
        f"detected {detected:.1f}s ({lost.get('connection')}), promoted {up:.1f}s after the power cut "
        f"(fence-peer answered at {promoted['answered_at']}s of the promotion); writer {result.line()}; "
        f"read back {back.line()}",
    )
    assert promoted["answered_at"], "promoting the cut-off survivor asked the arbiter nothing"
    assert result.io_errors == 0 and result.ios_after_last_stall > 0, result.errlog
    assert back.verify_errors == 0, back.errlog


def test_the_old_primary_returns_resyncs_then_cut_from_its_peer_and_the_arbiter_gives_way(
    pair: Pair, report: Reporter
) -> None:
    """After the power-off proof: storage-2 returns and resyncs from storage-1 (only what changed), both
    replicas' data the same; a planned switchover to storage-2 and back under the writer (storage-1 drained for
    maintenance, then storage-2): 0 I/O errors, every acknowledged write reads back, neither replica outdated;
    then storage-1, the primary, is cut from its peer while the controller does not answer it (a partition of
    the primary from peer and arbiter, gpu-1 still reaching both): it acknowledges nothing more and unlinks its
    portals; the arbiter promotes storage-2; every acknowledged write reads back, with 0 I/O errors."""
    assert pair.dead == "storage-2", "runs after the power-off proof"
    cluster, two = pair.cluster, pair.agents["storage-2"]
    booted = cluster.boot("storage-2")
    Fabric(cluster.vm("storage-2")).load()  # its modules, as its service manager would load them
    two.start()
    pair.dead = ""
    back = pair.wait("storage-2", "reconnected", lambda r: r.get("connection") in ("Connected", "SyncTarget"), 180)
    # it held primary of epoch 1 and came back a Secondary: the arbiter makes it secondary, DRBD resyncs it
    assert "volume" in pair.role("storage-2", "secondary")
    synced = pair.wait("storage-2", "resynced", lambda r: r.get("disk") == "UpToDate", 300)
    same = checksum(pair, "storage-1") == checksum(pair, "storage-2")
    fabric = Fabric(pair.vm("gpu-1"))
    have = ",".join(p.address for p in fabric.paths(NQN)) + ","
    for portal in portals(cluster, "storage-2"):  # its controllers may have been given up (ctrl_loss_tmo)
        if f"traddr={portal.traddr}," not in have:
            fabric.connect(portal, NQN, ctrl_loss_tmo=120)

    def all_live() -> bool:
        return sum(p.state == "live" for p in fabric.paths(NQN)) == 4

    assert wait_until(all_live, 60, 1.0), fabric.paths(NQN)
    planned = writer(pair, 70)  # two switchovers of about 20 s of calls each, with room on a slower machine
    time.sleep(8)
    there = switch(pair, "storage-1", "storage-2")
    assert wait_until(all_live, 60, 1.0), fabric.paths(NQN)  # storage-1's paths back, no namespace behind them
    back_again = switch(pair, "storage-2", "storage-1")
    moved, moved_read = written_and_read_back(pair, planned)
    states = {node: pair.get(node) for node in ("storage-1", "storage-2")}
    report(
        "replica pair: planned switchover there and back",
        f"calls {there:.1f}s and {back_again:.1f}s; writer {moved.line()}; read back {moved_read.line()}; "
        f"disks {states['storage-1'].get('disk')}/{states['storage-2'].get('disk')}",
    )
    assert moved.io_errors == 0 and moved.ios_after_last_stall > 0, moved.errlog
    assert moved_read.verify_errors == 0, moved_read.errlog
    assert (states["storage-1"].get("drbd_role"), states["storage-2"].get("role")) == ("Primary", "secondary")
    assert "Outdated" not in (states["storage-1"].get("disk"), states["storage-2"].get("disk")), states
    probe = writer(pair, 90)
    time.sleep(8)
    cut = time.monotonic()
    cut_replication(cluster, on=True)
    one, spool = pair.agents["storage-1"], "/run/nvmeof-csi/drbd/spool"
    assert wait_until(lambda: any(n.endswith(".req") for n in one.vm.listdir(spool)), 90, 0.5)
    asked = time.monotonic() - cut

    def storage_1_paths_down() -> bool:
        return all(p.state != "live" for p in fabric.paths(NQN) if node_of(cluster, p.address) == "storage-1")

    assert wait_until(storage_1_paths_down, 120, 1.0), fabric.paths(NQN)  # self-fenced: portals unlinked
    left = time.monotonic() - cut
    pair.wait("storage-2", "lost storage-1 too", lambda r: r.get("connection") != "Connected", 60)
    promoted = pair.role("storage-2", "primary", "fenced")  # the arbiter, storage-1 silent: its peer goes on
    assert "volume" in promoted, promoted
    up = time.monotonic() - cut
    result, read = written_and_read_back(pair, probe)
    report(
        "replica pair: return, then the primary partitioned",
        f"storage-2 booted in {booted:.0f}s, {back.get('connection')} then UpToDate "
        f"({int(synced.get('out_of_sync_bytes', 0)) >> 10} KiB left); data the same on both: {same}; "
        f"cut: fence-peer asked {asked:.1f}s, storage-1's paths down at {left:.1f}s (self-fenced), storage-2 "
        f"promoted at {up:.1f}s; writer {result.line()}; read back {read.line()}",
    )
    assert same, "the resynced replica's data differs from the primary's"
    assert result.io_errors == 0 and result.ios_after_last_stall > 0, result.errlog
    assert read.verify_errors == 0, read.errlog
