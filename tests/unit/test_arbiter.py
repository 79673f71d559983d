"""The controller's decisions for a replicated volume (``service/arbiter.py``), against the failures #54 names:
a partitioned old primary is never answered, an outdated replica is never promoted, a failover waits for the
primary's lease, and whatever the order of events the record keeps one writer (hypothesis drives sequences)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nvmeof_csi.service.arbiter import UP_TO_DATE, ReplicaRecord, failover, fence_peer, resynced, switchover

A, B = "storage-1", "storage-2"


def fresh() -> ReplicaRecord:
    return ReplicaRecord((A, B), primary=A)


def test_only_the_current_primary_is_answered_and_its_peer_is_outdated_first() -> None:
    record = fresh()
    refused = fence_peer(record, B, 1)  # the secondary lost the link: it is no writer
    assert not refused.allowed and refused.record == record
    ok = fence_peer(record, A, 1)
    assert ok.allowed and ok.record.outdated == {B} and ok.record.epoch == 2 and ok.record.since == 1
    again = fence_peer(ok.record, A, 1)
    assert again.allowed and not again.changed  # DRBD asks again after a reconnect attempt: same answer


def test_a_partitioned_old_primary_is_refused_after_a_failover_and_a_late_call_too() -> None:
    promoted = failover(fresh(), primary_lease_expired=True, candidate_disk=UP_TO_DATE)
    assert promoted.allowed and promoted.record.primary == B and promoted.record.outdated == {A}
    late = fence_peer(promoted.record, A, 1)  # A, cut off, still thinks it is primary of term 1
    assert not late.allowed and "is not the primary" in late.reason
    back = switchover(resynced(promoted.record, A, UP_TO_DATE).record, A, UP_TO_DATE).record
    assert back.primary == A and back.since == back.epoch
    assert not fence_peer(back, A, 1).allowed  # a call from A's first term, arriving now, is still refused
    assert fence_peer(back, A, back.since).allowed


def test_no_failover_while_the_primary_holds_its_lease_nor_to_an_outdated_or_unsynced_replica() -> None:
    assert not failover(fresh(), primary_lease_expired=False, candidate_disk=UP_TO_DATE).allowed
    outdated = fence_peer(fresh(), A, 1).record  # the replication link went first: B is outdated
    stale = failover(outdated, primary_lease_expired=True, candidate_disk=UP_TO_DATE)
    assert not stale.allowed and "outdated" in stale.reason and "no stale promotion" in stale.reason
    assert not failover(fresh(), primary_lease_expired=True, candidate_disk="Inconsistent").allowed
    assert not switchover(outdated, B, UP_TO_DATE).allowed


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["fence", "failover", "resynced", "switchover"]),
        st.sampled_from([A, B]),
        st.booleans(),
        st.sampled_from([UP_TO_DATE, "Outdated", "Inconsistent"]),
        st.integers(1, 6),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_whatever_happens_there_is_one_writer_never_outdated_and_the_epoch_only_grows(events: list) -> None:  # type: ignore[type-arg]
    record = fresh()
    for kind, agent, expired, disk, term in events:
        if kind == "fence":
            decision = fence_peer(record, agent, term)
        elif kind == "failover":
            decision = failover(record, expired, disk)
        elif kind == "resynced":
            decision = resynced(record, agent, disk)
        else:
            decision = switchover(record, agent, disk)
        new = decision.record
        assert new.primary in new.replicas and new.primary not in new.outdated
        assert new.outdated <= set(new.replicas) and len(new.outdated) < 2
        assert new.epoch == record.epoch + (1 if decision.changed else 0)
        assert new.since <= new.epoch and (new.primary == record.primary or new.since == new.epoch)
        if new.primary != record.primary:  # never promoted while it lacks acknowledged writes (until resynced)
            assert new.primary not in record.outdated
        record = new
