"""The controller's answers to DRBD's fence-peer calls (``service/arbiter.py`` decides; the agents carry the calls:
``agent/fence_spool.py``, ListFenceRequests / AnswerFenceRequest).

A replica that loses its peer with ``fencing resource-and-stonith`` freezes its I/O and asks; so does a cut-off
secondary asked to become primary. :meth:`FenceAnswers.run_once` goes over every agent, and for each call
waiting there reads the volume's record, decides with :func:`~nvmeof_csi.service.arbiter.fence_peer` (the
asker's term: the epoch its agent holds for its replica), writes a changed record by compare-and-swap, and then:

- **allowed** (the asker is the record's primary in its own term): the peer is fenced first (``SetReplicaRole
  fenced`` in the record's epoch: portals unlinked, disk Outdated when cut off; an unreachable peer is logged,
  the record holds it outdated and it is never promoted), then the asker is answered "peer fenced": it goes on
  as the one writer.
- **refused** (anyone else: a primary of an older term, a secondary, a volume without a record): answered "not
  fenced", so its I/O stays frozen and it acknowledges nothing more.

Contract: a record another writer changed meanwhile (the compare-and-swap lost) leaves the call waiting for the
next pass, decided again on a fresh read; so does an agent or record store that cannot be reached (the I/O stays
frozen, which is what fencing asks: never an answer without a decision). One call's failure never stops the
others'. Returns one line per call answered or left, for the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nvmeof_csi.errors import DriverError
from nvmeof_csi.rpc.background import every
from nvmeof_csi.service.arbiter import ReplicaRecord, fence_peer

log = logging.getLogger(__name__)
FENCED_ROLE = "fenced"


@dataclass(frozen=True)
class FenceCall:
    """One DRBD fence-peer call waiting on ``agent``: its volume, the helper's process, the asker's epoch."""

    agent: str
    volume_uuid: str
    pid: int
    epoch: int


class ReplicaAgents(Protocol):
    """The agents as the arbiter reaches them (``fleet/``)."""

    def names(self) -> list[str]: ...

    def fence_calls(self, agent: str) -> list[FenceCall]: ...

    def answer(self, call: FenceCall, peer_fenced: bool) -> bool: ...

    def set_role(self, agent: str, vol_uuid: str, role: str, epoch: int) -> None: ...


class Records(Protocol):
    """Where the records live (``kube/replica_records.py``: a Lease per volume)."""

    def read(self, vol_uuid: str) -> tuple[ReplicaRecord, str] | None: ...

    def replace(self, vol_uuid: str, record: ReplicaRecord, version: str) -> bool: ...


class FenceAnswers:
    def __init__(self, agents: ReplicaAgents, records: Records, count: Callable[[str], None] = lambda _: None) -> None:
        """``count``: told each answer given (``fenced`` or ``refused``), for the controller's metrics."""
        self._agents, self._records, self._count = agents, records, count

    def run(self, stop: threading.Event, period: float = 1.0) -> None:
        """A pass every ``period`` seconds until ``stop`` (the controller's background loop): a frozen replica
        waits about a second for its answer. A pass that fails is logged and the next one tries again."""
        every(period, self.run_once, "fence-peer")(stop)

    def run_once(self) -> list[str]:
        done: list[str] = []
        for agent in self._agents.names():
            try:
                calls = self._agents.fence_calls(agent)
            except DriverError as err:
                done.append(f"agent {agent}: its fence-peer calls cannot be read ({err}); they wait")
                continue
            for call in calls:
                try:
                    done.append(self._answer(call))
                except DriverError as err:
                    done.append(f"volume {call.volume_uuid} on {agent}: not answered yet ({err})")
        for line in done:
            log.info("fence-peer: %s", line)
        return done

    def _answer(self, call: FenceCall) -> str:
        where = f"volume {call.volume_uuid} on {call.agent} (term {call.epoch})"
        found = self._records.read(call.volume_uuid)
        if found is None:
            self._agents.answer(call, peer_fenced=False)
            self._count("refused")
            return f"{where}: refused: the volume has no replica record"
        record, version = found
        decision = fence_peer(record, call.agent, call.epoch)
        if not decision.allowed:
            self._agents.answer(call, peer_fenced=False)
            self._count("refused")
            return f"{where}: refused, its I/O stays frozen: {decision.reason}"
        if decision.changed and not self._records.replace(call.volume_uuid, decision.record, version):
            return f"{where}: the record changed meanwhile; decided again on the next pass"
        peer = decision.record.peer(call.agent)
        fenced = f"peer {peer} fenced"
        try:
            self._agents.set_role(peer, call.volume_uuid, FENCED_ROLE, decision.record.epoch)
        except DriverError as err:  # the record holds it outdated: it is never promoted
            fenced = f"peer {peer} unreachable, held outdated by the record ({err})"
        self._agents.answer(call, peer_fenced=True)
        self._count("fenced")
        return f"{where}: goes on as the one writer; {fenced}"


__all__ = ["FENCED_ROLE", "FenceAnswers", "FenceCall", "Records", "ReplicaAgents"]
