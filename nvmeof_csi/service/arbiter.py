"""The controller as the arbiter of a replicated volume (two agents, DRBD protocol C underneath): which agent is
the one writer, which replica may not be promoted, and when a primary may be given up. Pure decisions over one
record; where the record lives (the Kubernetes API, compare-and-swap on its resourceVersion) is the caller's.

The record: ``epoch`` (grows by one at every change), ``primary`` (the agent whose namespace is enabled: the
one writer), ``since`` (the epoch it was made primary in: an agent learns it when promoted and names it when it
asks) and ``outdated`` (replicas known to lack acknowledged writes). Rules:

- **fence-peer** (:func:`fence_peer`): DRBD on an agent lost its peer and froze I/O until the controller
  answers. Only the record's primary is answered "go on": its peer is marked outdated first, so the peer can
  never be promoted with writes missing. Anyone else (a primary of an older term, cut off while the other was
  promoted, or a late call from one) is refused: it stays frozen and acknowledges nothing more.
- **failover** (:func:`failover`): the primary's agent lease expired (it fenced itself, unlinking its ports,
  before that): the other replica is promoted only when it is not outdated and its disk is ``UpToDate``; the
  old primary is outdated (its disk may hold blocks the new primary never got: none acknowledged, but it must
  resync before it serves again). An outdated replica is never promoted automatically.
- **resynced** (:func:`resynced`): a replica that finished its resync (``UpToDate`` again) is no longer
  outdated.
- **switchover** (:func:`switchover`): a planned move of the writer to an in-sync peer (maintenance).

Contract: every function returns a :class:`Decision`: the record to write (``changed``: a new epoch) or the
same record with the reason why not. Invariants, whatever the sequence: the primary is one of the two replicas
and never outdated; the epoch never decreases and grows with every change; a replica that was outdated is
promoted only after :func:`resynced`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

UP_TO_DATE = "UpToDate"


@dataclass(frozen=True)
class ReplicaRecord:
    replicas: tuple[str, str]
    primary: str
    epoch: int = 1
    since: int = 1
    outdated: frozenset[str] = frozenset()

    def peer(self, agent: str) -> str:
        """The other replica of ``agent``."""
        return self.replicas[1] if agent == self.replicas[0] else self.replicas[0]

    def evolve(self, primary: str = "", outdated: frozenset[str] | None = None) -> ReplicaRecord:
        """The next epoch's record; a new ``primary`` starts its term in it."""
        epoch = self.epoch + 1
        new_primary = primary or self.primary
        return replace(
            self,
            epoch=epoch,
            primary=new_primary,
            since=epoch if new_primary != self.primary else self.since,
            outdated=self.outdated if outdated is None else outdated,
        )


@dataclass(frozen=True)
class Decision:
    record: ReplicaRecord
    allowed: bool
    reason: str

    @property
    def changed(self) -> bool:
        return self.allowed and self.reason != "unchanged"


def _refuse(record: ReplicaRecord, why: str) -> Decision:
    return Decision(record, False, why)


def fence_peer(record: ReplicaRecord, asker: str, term: int) -> Decision:
    """``asker`` (DRBD's fence-peer handler, naming ``term``: the epoch it was made primary in) lost its peer."""
    if asker not in record.replicas:
        return _refuse(record, f"agent {asker!r} holds no replica of this volume")
    if (asker, term) != (record.primary, record.since):
        return _refuse(
            record,
            f"agent {asker!r} (term {term}) is not the primary: {record.primary!r} is, since epoch {record.since}",
        )
    peer = record.peer(asker)
    if peer in record.outdated:
        return Decision(record, True, "unchanged")
    return Decision(record.evolve(outdated=record.outdated | {peer}), True, f"peer {peer!r} outdated")


def failover(record: ReplicaRecord, primary_lease_expired: bool, candidate_disk: str) -> Decision:
    """Promote the other replica once the primary's agent lease expired (``candidate_disk``: its DRBD disk
    state as its agent reports it)."""
    candidate = record.peer(record.primary)
    if not primary_lease_expired:
        return _refuse(record, f"primary {record.primary!r} still holds its lease: no failover")
    if candidate in record.outdated:
        return _refuse(
            record, f"replica {candidate!r} is outdated: the volume waits for {record.primary!r} (no stale promotion)"
        )
    if candidate_disk != UP_TO_DATE:
        return _refuse(record, f"replica {candidate!r} is {candidate_disk}, not {UP_TO_DATE}: not promoted")
    promoted = record.evolve(primary=candidate, outdated=record.outdated | {record.primary})
    return Decision(promoted, True, f"{candidate!r} promoted (epoch {promoted.epoch}); {record.primary!r} outdated")


def resynced(record: ReplicaRecord, agent: str, disk: str) -> Decision:
    """``agent`` reports its disk ``disk`` after a resync."""
    if agent not in record.outdated:
        return Decision(record, True, "unchanged")
    if disk != UP_TO_DATE:
        return _refuse(record, f"replica {agent!r} is {disk}: still outdated")
    return Decision(record.evolve(outdated=record.outdated - {agent}), True, f"replica {agent!r} in sync again")


def switchover(record: ReplicaRecord, target: str, target_disk: str) -> Decision:
    """A planned move of the one writer to ``target`` (both agents up, the peer in sync)."""
    if target not in record.replicas:
        return _refuse(record, f"agent {target!r} holds no replica of this volume")
    if target == record.primary:
        return Decision(record, True, "unchanged")
    if target in record.outdated or target_disk != UP_TO_DATE:
        return _refuse(record, f"replica {target!r} is not in sync ({target_disk}): no switchover")
    return Decision(record.evolve(primary=target), True, f"{target!r} is primary (epoch {record.epoch + 1})")
