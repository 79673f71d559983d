"""The controller's failover pass over replicated volumes (``service/arbiter.py`` decides; the records are
``kube/replica_records.py``'s, the agents ``fleet/replica_agents.py``'s).

For each volume's record, :meth:`Failover.run_once`:

- **the primary's agent answers**: it is made sure the primary holds its role in the record's epoch (a promotion
  the record holds but the agent never received, e.g. a controller killed between the two, is given again;
  the other replica, still Primary and connected from a switchover cut short, hands over first); the other
  replica, when back holding primary of an older term, is fenced if DRBD still holds it Primary and made
  secondary if it came back as a Secondary (a reboot: DRBD's handshake resyncs it); a replica left in
  ``handover`` is made secondary; a split brain (either replica ``StandAlone``: DRBD found both changed and
  refused to connect; after-sb is never automatic) is resolved as the record says: the other replica connects
  again discarding its changes (``discard``), the primary connects again, and the other resyncs from it; once
  an outdated one resynced (``UpToDate``, connected) the record clears its ``outdated`` and it is made
  secondary;
- **the primary's agent is draining** (an operator's ``nvmeofctl storage drain``): a planned switchover to the
  peer when the peer's agent answers, is not draining itself and its replica is connected and ``UpToDate``
  (:func:`~nvmeof_csi.service.arbiter.switchover`): the record first, then the old primary hands over (its
  portals unlinked, namespace disabled, demoted, never outdated), the peer is promoted, the old one made
  secondary. Otherwise the line says why the volume stays;
- **the primary's agent has not answered for ``grace`` seconds**: its peer is promoted only when the peer's
  agent answers and its replica has lost the primary too (not ``Connected``, not syncing: a peer that still
  replicates from the primary proves the primary alive, so a cut between the controller and the primary alone
  fails nothing over), and the arbiter's :func:`~nvmeof_csi.service.arbiter.failover` allows it (the peer not
  outdated, ``UpToDate``). The decided record is written by compare-and-swap first, then the peer is promoted in
  its epoch; its DRBD fence-peer call is answered by the fence-answers pass (``service/fence_answers.py``),
  which runs in a thread of its own because the promotion waits for that answer.

Contract: an outdated or not ``UpToDate`` peer is never promoted (the volume waits for its primary, and the line
says why); a lost compare-and-swap or an unreachable agent leaves the volume for the next pass; one volume's
failure never stops the others'. Returns one line per volume acted on or held back, for the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nvmeof_csi.errors import DriverError
from nvmeof_csi.rpc.background import every
from nvmeof_csi.service.arbiter import Decision, ReplicaRecord, failover, resynced, switchover

log = logging.getLogger(__name__)
PRIMARY, SECONDARY, FENCED, HANDOVER, DISCARD = "primary", "secondary", "fenced", "handover", "discard"
#: DRBD connection states in which the peer still hears the primary
HEARS_PRIMARY = ("Connected", "StartingSyncS", "StartingSyncT", "WFBitMapS", "WFBitMapT", "SyncSource", "SyncTarget")


@dataclass(frozen=True)
class ReplicaState:
    """One replica as its agent reports it: the role and epoch the controller gave it, and DRBD's state."""

    role: str
    epoch: int
    connection: str
    disk: str
    drbd_role: str = ""  # Primary | Secondary | "" (not up)


@dataclass(frozen=True)
class AgentStatus:
    """An agent that answered its Health call: whether an operator asked it to drain."""

    draining: bool = False


Seen = dict[str, AgentStatus | None]  # one pass's answers to Health, by agent


class FailoverAgents(Protocol):
    def status(self, agent: str) -> AgentStatus | None:
        """``None``: the agent did not answer."""

    def replica(self, agent: str, vol_uuid: str) -> ReplicaState: ...

    def set_role(self, agent: str, vol_uuid: str, role: str, epoch: int) -> None: ...


class FailoverRecords(Protocol):
    def volumes(self) -> list[str]: ...

    def read(self, vol_uuid: str) -> tuple[ReplicaRecord, str] | None: ...

    def replace(self, vol_uuid: str, record: ReplicaRecord, version: str) -> bool: ...


class Failover:
    def __init__(
        self,
        agents: FailoverAgents,
        records: FailoverRecords,
        grace: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        count: Callable[[str], None] = lambda _: None,
    ) -> None:
        """``grace``: how long a primary's agent must stay silent before its peer may take over; ``count``: told
        each move made (``unplanned``, ``planned``, ``split_brain``), for the controller's metrics."""
        self._agents, self._records, self._grace, self._clock = agents, records, grace, clock
        self._count = count
        self._silent_since: dict[str, float] = {}

    def run(self, stop: threading.Event, period: float = 2.0) -> None:
        """A pass every ``period`` seconds until ``stop``; a pass that fails is logged, the next tries again."""
        every(period, self.run_once, "failover")(stop)

    def run_once(self) -> list[str]:
        alive: dict[str, AgentStatus | None] = {}
        done: list[str] = []
        for vol in self._records.volumes():
            try:
                line = self._check(vol, alive)
            except DriverError as err:
                line = f"volume {vol}: left for the next pass ({err})"
            if line:
                done.append(line)
        for line in done:
            log.info("failover: %s", line)
        return done

    def _alive(self, agent: str, seen: Seen) -> bool:
        if agent not in seen:
            seen[agent] = self._agents.status(agent)
            if seen[agent] is not None:
                self._silent_since.pop(agent, None)
            else:
                self._silent_since.setdefault(agent, self._clock())
        return seen[agent] is not None

    def _draining(self, agent: str, seen: Seen) -> bool:
        status = seen.get(agent) if self._alive(agent, seen) else None
        return status is not None and status.draining

    def _check(self, vol: str, seen: Seen) -> str:
        found = self._records.read(vol)
        if found is None:
            return ""
        record, version = found
        primary = record.primary
        if self._alive(primary, seen):
            now = self._agents.replica(primary, vol)
            if now.role != PRIMARY or now.epoch < record.since:
                self._step_aside(vol, record, seen)
                self._agents.set_role(primary, vol, PRIMARY, record.epoch)
                return f"volume {vol}: {primary} given its primary role (epoch {record.epoch}; it held {now.role})"
            if self._draining(primary, seen):
                return self._switch(vol, record, version, seen)
            return self._rejoin(vol, record, version, seen, now.connection)
        silent = self._clock() - self._silent_since[primary]
        if silent < self._grace:
            return f"volume {vol}: primary {primary} silent for {silent:.0f} s (failover after {self._grace:.0f} s)"
        peer = record.peer(primary)
        if not self._alive(peer, seen):
            return f"volume {vol}: both {primary} and {peer} silent: no failover"
        other = self._agents.replica(peer, vol)
        if other.connection in HEARS_PRIMARY:
            return f"volume {vol}: {peer} still replicates from {primary} ({other.connection}): no failover"
        decision = failover(record, True, other.disk)
        held = self._written(vol, decision, version, "no failover")
        if held:
            return held
        self._agents.set_role(peer, vol, PRIMARY, decision.record.epoch)
        self._count("unplanned")
        return f"volume {vol}: {decision.reason} after {primary} was silent {silent:.0f} s"

    def _written(self, vol: str, decision: Decision, version: str, refused: str) -> str:
        """``""`` once ``decision`` is written over ``version`` (the caller then acts on it); else the line that
        says why not: refused (``refused``: what did not happen) or the record changed meanwhile."""
        if not decision.allowed:
            return f"volume {vol}: {refused}: {decision.reason}"
        if not self._records.replace(vol, decision.record, version):
            return f"volume {vol}: the record changed meanwhile; decided again on the next pass"
        return ""

    def _step_aside(self, vol: str, record: ReplicaRecord, seen: Seen) -> None:
        """Before the record's primary is (again) given its role: the other replica, still Primary and connected
        (a switchover cut short between the record and the hand-over), hands over, or DRBD refuses the promotion."""
        other = record.peer(record.primary)
        if self._alive(other, seen):
            now = self._agents.replica(other, vol)
            if now.role == PRIMARY and now.drbd_role == "Primary" and now.connection == "Connected":
                self._agents.set_role(other, vol, HANDOVER, record.epoch)

    def _switch(self, vol: str, record: ReplicaRecord, version: str, seen: Seen) -> str:
        """A planned switchover away from the draining primary (see the module's contract)."""
        primary, peer = record.primary, record.peer(record.primary)
        if not self._alive(peer, seen) or self._draining(peer, seen):
            why = "does not answer" if seen[peer] is None else "is draining too"
            return f"volume {vol}: {primary} drains but {peer} {why}: it stays on {primary}"
        other = self._agents.replica(peer, vol)
        if other.connection != "Connected":
            return f"volume {vol}: {primary} drains but {peer} is {other.connection}: it stays on {primary}"
        decision = switchover(record, peer, other.disk)
        held = self._written(vol, decision, version, f"{primary} drains")
        if held:
            return held
        epoch = decision.record.epoch
        self._agents.set_role(primary, vol, HANDOVER, epoch)
        self._agents.set_role(peer, vol, PRIMARY, epoch)
        self._agents.set_role(primary, vol, SECONDARY, epoch)
        self._count("planned")
        return f"volume {vol}: planned switchover from draining {primary}: {decision.reason}"

    def _rejoin(self, vol: str, record: ReplicaRecord, version: str, seen: Seen, mine: str) -> str:
        """The other replica, back: a stale primary (of an older term) is fenced; an outdated one that resynced
        (``UpToDate`` and connected again) is recorded in sync and made secondary; a split brain is resolved
        (``mine``: the primary's DRBD connection state)."""
        other = record.peer(record.primary)
        if not self._alive(other, seen):
            return ""
        now = self._agents.replica(other, vol)
        if now.role == PRIMARY:  # a stale primary: still Primary in DRBD (it never went down) -> fenced; else it
            # rebooted as a Secondary, which DRBD's own handshake resyncs: secondary (fencing it would cut it
            # from the primary again and freeze the primary's I/O for a fence-peer call)
            role = FENCED if now.drbd_role == "Primary" else SECONDARY
            self._agents.set_role(other, vol, role, record.epoch)
            return f"volume {vol}: {other} held primary of epoch {now.epoch}; now {role} (epoch {record.epoch})"
        if now.role == HANDOVER:  # a switchover cut short after the promotion
            self._agents.set_role(other, vol, SECONDARY, record.epoch)
            return f"volume {vol}: {other} handed over; now secondary (epoch {record.epoch})"
        if "StandAlone" in (now.connection, mine):  # the loser first: it waits for the primary's connect
            self._agents.set_role(other, vol, DISCARD, record.epoch)
            self._agents.set_role(record.primary, vol, PRIMARY, record.epoch)  # its own StandAlone side connects
            self._count("split_brain")
            return (
                f"volume {vol}: split brain ({other} {now.connection}, {record.primary} {mine}) resolved as the "
                f"record says: {other} discards its changes and resyncs from {record.primary}"
            )
        if other not in record.outdated or now.connection != "Connected":
            return ""
        decision = resynced(record, other, now.disk)
        if not decision.changed or not self._records.replace(vol, decision.record, version):
            return ""
        self._agents.set_role(other, vol, SECONDARY, decision.record.epoch)
        return f"volume {vol}: {decision.reason}"


__all__ = ["AgentStatus", "Failover", "FailoverAgents", "FailoverRecords", "ReplicaState"]
