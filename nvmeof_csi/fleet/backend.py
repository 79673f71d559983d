"""The controller's NVMe-oF backend: a ``TargetBackend`` over the target agents of a fabric map.

Contract (in addition to ``service/contracts.py``):
- Stateless: everything comes from the agents (a volume's CSI name is recorded with it), so a controller
  restart loses nothing.
- Placement as in ``topology/placement.py``; a clone or a volume from a snapshot goes to its source's agent.
- One volume per name, also with controllers racing: a create reserves the name (UUID and agent) at the name's
  home agent before anything is made, and then creates exactly what the reservation holds
  (``fleet/names.py``); a retry after a crash anywhere in between finishes the same volume. A delete
  releases the reservation first (a crash then leaves a volume the CO's retried delete removes, never a
  reservation of a deleted volume). A create the reserved agent refuses for want of space releases it, so a
  retry may place the volume elsewhere.
- An agent that cannot be reached makes name lookups and listings fail with UNAVAILABLE (never a silently
  shorter answer) when the request could have used it; placement skips it.
- The volume context tells a node everything it needs: NQN, namespace UUID, transport, portals and the
  StorageClass's connection tunables. The publish context carries the host NQN and readonly.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from functools import partial

from nvmeof_csi.agentclient.api import AgentApi, default_client
from nvmeof_csi.agentclient.msgs import pair_volume_of, volume_of
from nvmeof_csi.errors import Aborted, DeadlineExceeded, DriverError, NotFound, ResourceExhausted, Unavailable
from nvmeof_csi.fleet.census import KEPT_ON_LABEL, NameCensus
from nvmeof_csi.fleet.conditions import condition_of, side_view
from nvmeof_csi.fleet.names import Held, NameDirectory
from nvmeof_csi.fleet.pairs import PAIR_LABEL, PairRecords, Pairs
from nvmeof_csi.fleet.snapshots import AgentSnapshots
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.dataset import DatasetSpec
from nvmeof_csi.nvmeof.nqn import host_nqn_of, readonly_namespace_uuid, readonly_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import (
    NO_SECRETS,
    Condition,
    ContentSource,
    TopologyRequirement,
    Volume,
    VolumeRef,
)
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from nvmeof_csi.topology.placement import could_hold, partner_for, place, place_pair, source_agent

log = logging.getLogger(__name__)


#: volume labels: the CSI name, and the agent that keeps the name's reservation
NAME_LABEL = "csi.nvmeof.io/name"
#: how long a controller waits for an agent to fill a dataset volume when the caller set no deadline
DATASET_CREATE_TIMEOUT = 3600.0
#: how often a controller looks at a volume another call is filling
FILL_POLL_SECONDS = 1.0


class AgentBackend(AgentSnapshots):
    supports_snapshots = True

    def __init__(
        self,
        fabric: FabricMap,
        client: Callable[[AgentEntry], AgentApi] = default_client,
        locality: Callable[[DatasetSpec], Mapping[str, int]] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        census: bool = False,
        records: PairRecords | None = None,
    ) -> None:
        """``census``: look names up through a name census (``fleet/census.py``; its sweeps are
        run by the caller as a background loop, ``census.run``) rather than on every agent; ``records``: the
        arbiter's records of replicated volumes (none: ``replicas: 2`` is refused, ``fleet/pairs.py``)."""
        super().__init__(fabric, client, clock)
        self._locality = locality
        self._sleep, self._clock = sleep, clock
        self.census = NameCensus(fabric.agents, self._client, clock) if census else None
        self._names = NameDirectory(fabric, self._client, self.census)
        self.pairs = Pairs(self, records, sleep, clock)

    # -- volumes -------------------------------------------------------------------------------------------
    def find_volume_by_name(
        self,
        name: str,
        parameters: VolumeParameters | None = None,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
    ) -> Volume | None:
        transport = parameters.transport if parameters is not None else "tcp"
        scope = partial(could_hold, transport=transport, requirement=requirement, source=source)
        held = self._names.find(name, scope if parameters is not None else lambda _: True)
        return self._volume_held(held) if held is not None else None

    def _volume_held(self, held: Held) -> Volume | None:
        """The volume a reservation (or a name lookup) points at; ``None`` while it is only reserved."""
        entry = self._entry(held.agent)
        if entry is None:
            raise Unavailable(
                f"volume {held.name!r} is reserved on agent {held.agent}, which the fabric map does "
                "not list (restore it in the map)"
            )
        try:
            return self._volume_of(entry, self._client(entry).get_volume(held.uuid))
        except NotFound:
            return None

    def _volume_of(self, entry: AgentEntry, vol: pb.Volume) -> Volume:
        """``vol`` as the service's volume; a replica with its peer's (both agents' portals)."""
        if not vol.replica.peer_agent:
            return volume_of(entry, vol)
        peer = self.pairs.peer_of(entry, vol)
        return pair_volume_of(entry, vol, self._client(peer).get_volume(vol.uuid))

    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: VolumeParameters,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
        wait: float | None = None,
    ) -> Volume:
        transport = parameters.transport
        scope = partial(could_hold, transport=transport, requirement=requirement, source=source)
        held = self._names.find(name, scope)
        if held is None:
            if source is not None:
                entry = source_agent(self._entry(source.ref.location), source, transport, requirement)
            elif parameters.replicas > 1:
                entry = place_pair(self._candidates(), capacity_bytes, transport, requirement)[0]
            else:
                entry = self._place(capacity_bytes, transport, requirement, parameters)
            held = self._names.reserve(name, str(uuidlib.uuid4()), entry.name, scope)
        elif not held.kept_on:  # a volume made before reservations: keep what exists
            held = self._names.reserve(name, held.uuid, held.agent, scope)
        if parameters.replicas > 1:
            return self._make_pair(held, capacity_bytes, parameters, requirement)
        limit = DATASET_CREATE_TIMEOUT if wait is None else max(1.0, min(wait, DATASET_CREATE_TIMEOUT))
        existing = self._volume_held(held)
        if existing is not None:
            return existing if existing.ready else self._await_filled(existing, limit)  # hold no agent thread
        return self._create_held(held, capacity_bytes, parameters, source, limit)

    def _place(
        self, size: int, transport: str, requirement: TopologyRequirement | None, parameters: VolumeParameters
    ) -> AgentEntry:
        """The agent a new volume goes to; when nothing fits by the cached free capacity, once more by fresh
        figures before ``ResourceExhausted`` (a cached figure is never the reason a create fails)."""
        near = self._cached_near(parameters.dataset)
        try:
            return place(self._candidates(), size, transport, requirement, near)
        except ResourceExhausted:
            self.capacity_seen.forget_all()
            return place(self._candidates(), size, transport, requirement, near)

    def _make_pair(
        self, held: Held, size: int, parameters: VolumeParameters, requirement: TopologyRequirement | None
    ) -> Volume:
        first = self._require(VolumeRef(held.agent, held.uuid))

        def partner() -> AgentEntry:
            return partner_for(first, self._candidates(), size, parameters.transport)

        labels = {NAME_LABEL: held.name, KEPT_ON_LABEL: held.kept_on}
        one, two = self.pairs.make(held.name, held.uuid, first, partner, size, parameters, labels)
        for entry in (first, self.pairs.peer_of(first, one)):
            self.capacity_seen.forget(entry.name)
        return pair_volume_of(first, one, two)

    def _create_held(
        self,
        held: Held,
        capacity_bytes: int,
        parameters: VolumeParameters,
        source: ContentSource | None,
        limit: float,
    ) -> Volume:
        entry = self._require(VolumeRef(held.agent, held.uuid))
        timeout = limit if parameters.dataset is not None else None
        try:
            created = self._client(entry).create_volume(
                held.name,
                capacity_bytes,
                parameters.to_map(),
                {NAME_LABEL: held.name, KEPT_ON_LABEL: held.kept_on},
                source_volume=source.ref.uuid if source and source.kind == "volume" else "",
                source_snapshot=source.ref.uuid if source and source.kind == "snapshot" else "",
                timeout=timeout,
                vol_uuid=held.uuid,
            )
        except ResourceExhausted:
            self._names.release(held.name, held.uuid, held.kept_on)  # a retry may place it elsewhere
            self.capacity_seen.forget(entry.name)  # it had less than placement thought: read it again
            raise
        except Unavailable:  # the agent, or what it needed (Alluxio for a fill): read it again, never assume
            self.capacity_seen.forget(entry.name)
            raise
        except DeadlineExceeded:
            if timeout is None:
                raise
            raise Aborted(
                f"volume {held.name!r} is still being filled on agent {entry.name}; the fill goes on "
                "and a retry returns the volume once it is ready"
            ) from None
        self.capacity_seen.spent(entry.name, capacity_bytes)
        return volume_of(entry, created)

    def _await_filled(self, volume: Volume, limit: float) -> Volume:
        """``volume`` once its agent reports it ready, polled for at most ``limit`` seconds (no agent thread is
        held meanwhile); ``Aborted`` with the fill's progress when it is still being filled then."""
        entry = self._entry(volume.ref.location)
        if entry is None:
            return volume
        deadline = self._clock() + limit
        while True:
            vol = self._client(entry).get_volume(volume.ref.uuid)
            if vol.status != "creating":
                return volume_of(entry, vol)
            if self._clock() >= deadline:
                progress = vol.labels.get("dataset.progress", "")
                raise Aborted(
                    f"volume {volume.name!r} is still being filled on agent {entry.name}"
                    f"{f' ({progress})' if progress else ''}; a retry returns it once it is ready"
                )
            self._sleep(min(FILL_POLL_SECONDS, max(0.0, deadline - self._clock())))

    def _cached_near(self, spec: DatasetSpec | None) -> dict[str, int]:
        """For a dataset volume: agent name -> bytes of the data set cached on the Alluxio worker next to it."""
        if spec is None or self._locality is None:
            return {}
        try:
            held = self._locality(spec)
        except DriverError as err:
            log.warning("data set %s: cache locality unknown (%s); placing by capacity", spec.path, err)
            return {}
        return {a.name: held.get(a.alluxio_host, 0) for a in self.fabric.agents if a.alluxio_host}

    def get_volume(self, ref: VolumeRef) -> Volume | None:
        entry = self._entry(ref.location)
        if entry is None:
            return None
        try:
            return self._volume_of(entry, self._client(entry).get_volume(ref.uuid))
        except NotFound:
            return None

    def list_volumes(self) -> list[Volume]:
        volumes = [
            self._volume_of(e, v)
            for e in self.fabric.agents
            for v in self._client(e).list_volumes()
            if v.labels.get(PAIR_LABEL) != "second"  # a replicated volume once: as its first replica
        ]
        return sorted(volumes, key=lambda v: v.ref.uuid)

    def delete_volume(self, ref: VolumeRef) -> None:
        entry = self._entry(ref.location)
        if entry is None:
            return
        client, vol = self._client(entry), None
        try:
            vol = client.get_volume(ref.uuid)
            self._names.release(vol.name, vol.uuid, vol.labels.get(KEPT_ON_LABEL, ""))  # first: see the module
        except NotFound:
            pass  # gone, or a delete the agent has not finished: finishing it is the agent's (idempotent) call
        if (vol is not None and vol.replica.peer_agent) or (vol is None and self.pairs.recording):
            self.pairs.remove(entry, vol, ref.uuid)  # both replicas, then the record (a retry finds the peer there)
        else:
            client.delete_volume(ref.uuid)
        self.capacity_seen.forget_all()  # space came back: read it again at the next placement

    def expand_volume(self, ref: VolumeRef, capacity_bytes: int) -> int:
        entry = self._require(ref)
        client = self._client(entry)
        vol = client.get_volume(ref.uuid)
        if vol.replica.peer_agent:  # both replicas, in DRBD's order
            size = self.pairs.grow(entry, vol, capacity_bytes)
            self.capacity_seen.forget_all()
            return size
        size = int(client.resize_volume(ref.uuid, capacity_bytes).capacity_bytes)
        self.capacity_seen.forget(entry.name)
        return size

    def modify_volume(self, ref: VolumeRef, changes: Mapping[str, str]) -> None:
        self._client(self._require(ref)).modify_volume(ref.uuid, changes)

    def publish(
        self,
        ref: VolumeRef,
        node_id: str,
        readonly: bool,
        secrets: Mapping[str, str] = NO_SECRETS,
        node_name: str = "",
    ) -> Mapping[str, str]:
        host, entry = host_nqn_of(node_id), self._require(ref)
        # an `auth` volume's agent issues the host's keys; the grant records the host's Node
        granted = self._client(entry).allow_host(ref.uuid, host, readonly=readonly, node_name=node_name)
        for side in self._both(entry, granted):
            self._client(side).allow_host(ref.uuid, host, readonly=readonly, node_name=node_name)
        if not readonly:
            return {"hostNqn": host, "readonly": "false"}
        # the agent allows a read-only host only on the subsystem that refuses writes
        nqn, namespace = readonly_nqn(ref.uuid), readonly_namespace_uuid(ref.uuid)
        return {"hostNqn": host, "readonly": "true", "nqn": nqn, "namespaceUUID": namespace}

    def unpublish(self, ref: VolumeRef, node_id: str) -> None:
        entry = self._entry(ref.location)
        if entry is None:
            return
        try:
            for side in self._both(entry, self._client(entry).deny_host(ref.uuid, host_nqn_of(node_id))):
                self._client(side).deny_host(ref.uuid, host_nqn_of(node_id))
        except NotFound:
            return

    def fence(self, ref: VolumeRef, node_id: str, reason: str, boot_id: str) -> None:
        entry, host = self._require(ref), host_nqn_of(node_id)
        for side in self._both(entry, self._client(entry).fence_host(ref.uuid, host, reason, boot_id)):
            self._client(side).fence_host(ref.uuid, host, reason, boot_id)

    def unfence(self, ref: VolumeRef, node_id: str) -> None:
        entry, host = self._require(ref), host_nqn_of(node_id)
        for side in self._both(entry, self._client(entry).unfence_host(ref.uuid, host)):
            self._client(side).unfence_host(ref.uuid, host)

    def _both(self, entry: AgentEntry, done: pb.Volume) -> list[AgentEntry]:
        """After a call on ``entry``'s replica: the other replica's agent, which takes the same call."""
        return [self.pairs.peer_of(entry, done)] if done.replica.peer_agent else []

    def condition(self, ref: VolumeRef) -> Condition:
        """What the volume's agent says (``fleet/conditions.py``); a replicated volume's from both replicas' agents
        (the peer from the first's replica, else from the record when the first cannot be reached)."""
        entry = self._require(ref)
        first = side_view(entry, self._client(entry), ref.uuid)
        peer = self._entry(first.peer_agent or self.pairs.recorded_peer(entry.name, ref.uuid))
        if peer is None:
            return condition_of([first])
        return condition_of([first, side_view(peer, self._client(peer), ref.uuid)])
