"""Replicated volumes (``replicas: 2``) as the controller makes, finds and removes them: one DRBD replica of the
volume on each of two agents on different storage nodes (``topology/placement.py``'s ``place_pair``), the same
UUID, name and NVMe identity on both (``agent/replica_ops.py``), and the arbiter's record
(``kube/replica_records.py``) naming the pair and its one writer.

Contract:
- The volume ID names the *first* agent (the one placement chose, primary at birth); its replica's
  ``peer_agent`` names the other, and so does the record. Both replicas carry :data:`PAIR_LABEL` (``first`` or
  ``second``), so a listing shows each volume once.
- :meth:`Pairs.make` is idempotent and safe to repeat after a crash anywhere. The record is the commit point:
  it is created once both replicas exist and are Connected, and only then is the first replica promoted in the
  record's epoch. A pair without a record was never handed to anyone (CreateVolume had not returned), so a
  repeat that finds one replica without the other removes it and makes both again with a fresh shared secret
  (the secret is never read back from an agent). A pair that does not connect within ``connect_timeout`` is
  ``Unavailable`` naming both agents and the state seen; a repeat waits again.
- The DRBD minor and port are the first free on both agents (their own listings), chosen under one lock per
  controller; an agent refuses a minor or port another of its volumes holds, so a race with another controller
  fails, never doubles.
- :meth:`Pairs.remove` deletes both replicas (the peer from the first's replica, else the record), then the
  record: a crash between leaves what a repeated delete finishes.
- Without a record store (a controller outside Kubernetes) ``replicas: 2`` is ``FailedPrecondition``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Protocol

from nvmeof_csi.agentclient.api import AgentApi
from nvmeof_csi.errors import (
    AlreadyExists,
    DriverError,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.arbiter import ReplicaRecord
from nvmeof_csi.topology.fabric_map import AgentEntry

#: which side of a pair a replica is: ``first`` (the agent the volume ID names) or ``second``
PAIR_LABEL = "csi.nvmeof.io/replica"
#: DRBD minors and replication ports handed out: slot i is minor FIRST_MINOR + i on port FIRST_PORT + i
FIRST_MINOR, FIRST_PORT, SLOTS = 100, 7800, 900
CONNECTED = "Connected"


class PairRecords(Protocol):
    """The arbiter's records as the pair maker needs them (``kube/replica_records.py``)."""

    def read(self, vol_uuid: str) -> tuple[ReplicaRecord, str] | None: ...

    def create(self, vol_uuid: str, record: ReplicaRecord) -> None: ...

    def delete(self, vol_uuid: str) -> None: ...


class PairAgents(Protocol):
    """The fleet as the pair maker reaches it."""

    def client_of(self, entry: AgentEntry) -> AgentApi: ...

    def entry_of(self, name: str) -> AgentEntry | None: ...


def _get(client: AgentApi, vol_uuid: str) -> pb.Volume | None:
    try:
        return client.get_volume(vol_uuid)
    except NotFound:
        return None


class Pairs:
    def __init__(
        self,
        agents: PairAgents,
        records: PairRecords | None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        secret: Callable[[], str] = lambda: secrets.token_hex(16),
        connect_timeout: float = 120.0,
    ) -> None:
        self._agents, self._records = agents, records
        self._sleep, self._clock, self._secret = sleep, clock, secret
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()

    def _need_records(self) -> PairRecords:
        if self._records is None:
            raise FailedPrecondition(
                "parameter 'replicas: 2' needs the controller's replica records (the Kubernetes API): this "
                "controller has none"
            )
        return self._records

    @property
    def recording(self) -> bool:
        """Whether this controller keeps replica records (``--replica-records``)."""
        return self._records is not None

    def peer_of(self, first: AgentEntry, vol: pb.Volume) -> AgentEntry:
        """The agent of ``vol``'s other replica (``Unavailable`` when the fabric map no longer lists it). An agent
        whose replica names another peer than the controller's record does is not believed
        (``FailedPrecondition``): a node can act only as itself, never steer the controller to another agent."""
        recorded = self.recorded_peer(first.name, vol.uuid)
        if recorded and recorded != vol.replica.peer_agent:
            raise FailedPrecondition(
                f"volume {vol.uuid}: agent {first.name} names {vol.replica.peer_agent[:64]!r} as its other replica, "
                f"the controller's record names {recorded!r}: refused until they agree (nvmeofctl volumes show)"
            )
        entry = self._agents.entry_of(vol.replica.peer_agent)
        if entry is None:
            raise Unavailable(
                f"volume {vol.uuid} on {first.name} has its other replica on agent {vol.replica.peer_agent!r}, which "
                "the fabric map does not list (restore it in the map)"
            )
        return entry

    def recorded_peer(self, agent: str, vol_uuid: str) -> str:
        """The other replica's agent as the record names it ("" without records, a record, or when unreadable)."""
        if self._records is None:
            return ""
        try:
            found = self._records.read(vol_uuid)
        except DriverError:
            return ""
        return found[0].peer(agent) if found is not None and agent in found[0].replicas else ""

    def make(
        self,
        name: str,
        vol_uuid: str,
        first: AgentEntry,
        partner: Callable[[], AgentEntry],
        size: int,
        parameters: VolumeParameters,
        labels: Mapping[str, str],
    ) -> tuple[pb.Volume, pb.Volume]:
        """Both replicas of ``vol_uuid`` made, connected, recorded, the first promoted: (first's, second's).
        ``partner``: where the second goes when nothing was made yet (placement's choice)."""
        records = self._need_records()
        with self._lock:
            one = _get(self._agents.client_of(first), vol_uuid)
            peer = self.peer_of(first, one) if one is not None else partner()
            two = _get(self._agents.client_of(peer), vol_uuid)
            if records.read(vol_uuid) is None and (one is None or two is None):
                for entry, found in ((first, one), (peer, two)):
                    if found is not None:  # half made, never handed out: made again with a fresh secret
                        self._agents.client_of(entry).delete_volume(vol_uuid)
                one, two = self._create_both(name, vol_uuid, (first, peer), size, parameters, labels)
        if one is None or two is None:
            raise FailedPrecondition(
                f"volume {vol_uuid}'s replica record names {first.name} and {peer.name}, but "
                f"{first.name if one is None else peer.name} holds no replica of it: an operator must look"
            )
        self._await_connected(vol_uuid, first, peer)
        recorded = records.read(vol_uuid)
        if recorded is None:
            with suppress(AlreadyExists):  # another call of this create came first: the same record
                records.create(vol_uuid, ReplicaRecord((first.name, peer.name), primary=first.name))
            recorded = records.read(vol_uuid)
        if recorded is not None and recorded[0].epoch == 1 and one.replica.role != "primary":
            one = self._agents.client_of(first).set_replica_role(vol_uuid, "primary", 1)
        return one, two

    def _create_both(
        self,
        name: str,
        vol_uuid: str,
        sides: tuple[AgentEntry, AgentEntry],
        size: int,
        parameters: VolumeParameters,
        labels: Mapping[str, str],
    ) -> tuple[pb.Volume, pb.Volume]:
        clients = [self._agents.client_of(e) for e in sides]
        health = [c.health() for c in clients]
        for entry, h in zip(sides, health, strict=True):
            if not h.replication_address:
                raise FailedPrecondition(
                    f"agent {entry.name} is not configured for replicated volumes (--replication-address)"
                )
        minor, port = self._free_slot(clients)
        secret = self._secret()
        made: list[pb.Volume] = []
        for i, client in enumerate(clients):
            other = 1 - i
            replica = {
                "peer_agent": sides[other].name, "peer_host": health[other].replication_host,
                "peer_address": health[other].replication_address, "address": health[i].replication_address,
                "port": str(port), "minor": str(minor), "secret": secret,
            }  # fmt: skip
            side_labels = {**labels, PAIR_LABEL: ("first", "second")[i]}
            made.append(
                client.create_volume(name, size, parameters.to_map(), side_labels, vol_uuid=vol_uuid, replica=replica)
            )
        return made[0], made[1]

    @staticmethod
    def _free_slot(clients: list[AgentApi]) -> tuple[int, int]:
        taken_minors, taken_ports = set(), set()
        for client in clients:
            for vol in client.list_volumes():
                if vol.HasField("replica"):
                    taken_minors.add(vol.replica.minor)
                    taken_ports.add(vol.replica.port)
        for slot in range(SLOTS):
            if FIRST_MINOR + slot not in taken_minors and FIRST_PORT + slot not in taken_ports:
                return FIRST_MINOR + slot, FIRST_PORT + slot
        raise ResourceExhausted(f"no DRBD minor and port free on both agents ({SLOTS} replicated volumes)")

    def _await_connected(self, vol_uuid: str, first: AgentEntry, peer: AgentEntry) -> None:
        deadline = self._clock() + self._connect_timeout
        client = self._agents.client_of(first)
        while True:
            now = client.get_volume(vol_uuid).replica
            if now.connection == CONNECTED or now.connection.startswith("Sync"):
                return
            if self._clock() >= deadline:
                raise Unavailable(
                    f"the replicas of volume {vol_uuid} on {first.name} and {peer.name} did not connect within "
                    f"{self._connect_timeout:.0f} s ({first.name}: {now.connection or 'not up'}); check the "
                    "replication link between them"
                )
            self._sleep(1.0)

    def remove(self, first: AgentEntry, vol: pb.Volume | None, vol_uuid: str) -> None:
        """Both replicas of ``vol_uuid`` (``vol``: the first's, ``None`` when gone there), then its record."""
        records = self._need_records()
        peer: AgentEntry | None = None
        if vol is not None:
            peer = self.peer_of(first, vol)
        else:
            found = records.read(vol_uuid)
            name = found[0].peer(first.name) if found is not None else ""
            peer = self._agents.entry_of(name) if name else None
        for entry in (e for e in (peer, first) if e is not None):
            self._agents.client_of(entry).delete_volume(vol_uuid)
        records.delete(vol_uuid)

    def grow(self, first: AgentEntry, vol: pb.Volume, capacity_bytes: int) -> int:
        """Both replicas of ``vol`` (``first``'s replica) grown to ``capacity_bytes``: the Secondary's file first,
        then the Primary's, whose agent grows the DRBD device (``drbdadm resize`` needs both backing devices
        grown). Only while the Primary is connected to its peer, checked before anything grows
        (``FailedPrecondition``); ``Unavailable`` while neither replica is Primary (a failover under way). A
        retry repeats what is done (an agent's resize to its own size changes nothing). The new size."""
        peer = self.peer_of(first, vol)
        other = self._agents.client_of(peer).get_volume(vol.uuid)
        sides = [(first, vol), (peer, other)]
        primary = [(e, v) for e, v in sides if v.replica.drbd_role == "Primary"]
        if not primary:
            raise Unavailable(f"volume {vol.uuid}: neither replica is Primary now (a failover under way); retry")
        (lead, seen), (follow, _) = primary[0], next((e, v) for e, v in sides if e is not primary[0][0])
        if seen.replica.connection != "Connected":
            raise FailedPrecondition(
                f"volume {vol.uuid} grows only while both replicas are connected; its Primary on {lead.name} is "
                f"{seen.replica.connection or 'down'} (nvmeofctl volumes show)"
            )
        self._agents.client_of(follow).resize_volume(vol.uuid, capacity_bytes)
        return int(self._agents.client_of(lead).resize_volume(vol.uuid, capacity_bytes).capacity_bytes)


__all__ = ["PAIR_LABEL", "PairAgents", "PairRecords", "Pairs"]
