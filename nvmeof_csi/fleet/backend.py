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
from nvmeof_csi.agentclient.msgs import snapshot_of, volume_of
from nvmeof_csi.errors import Aborted, DeadlineExceeded, DriverError, NotFound, ResourceExhausted, Unavailable
from nvmeof_csi.fleet.agents import AgentFleet
from nvmeof_csi.fleet.census import KEPT_ON_LABEL, NameCensus
from nvmeof_csi.fleet.names import Held, NameDirectory
from nvmeof_csi.nvmeof.dataset import DatasetSpec
from nvmeof_csi.nvmeof.nqn import host_nqn_of, readonly_namespace_uuid, readonly_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import (
    NO_SECRETS,
    Condition,
    ContentSource,
    Problem,
    Snapshot,
    TopologyRequirement,
    Volume,
    VolumeRef,
)
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from nvmeof_csi.topology.placement import place, reachable

log = logging.getLogger(__name__)


#: volume labels: the CSI name, and the agent that keeps the name's reservation
NAME_LABEL = "csi.nvmeof.io/name"
#: how long a controller waits for an agent to fill a dataset volume when the caller set no deadline
DATASET_CREATE_TIMEOUT = 3600.0
#: how often a controller looks at a volume another call is filling
FILL_POLL_SECONDS = 1.0


class AgentBackend(AgentFleet):
    supports_snapshots = True

    def __init__(
        self,
        fabric: FabricMap,
        client: Callable[[AgentEntry], AgentApi] = default_client,
        locality: Callable[[DatasetSpec], Mapping[str, int]] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        census: bool = False,
    ) -> None:
        """``census``: look names up through a name census (``fleet/census.py``; its sweeps are
        run by the caller as a background loop, ``census.run``) rather than on every agent."""
        super().__init__(fabric, client, clock)
        self._locality = locality
        self._sleep, self._clock = sleep, clock
        self.census = NameCensus(fabric.agents, self._client, clock) if census else None
        self._names = NameDirectory(fabric, self._client, self.census)

    # -- volumes -------------------------------------------------------------------------------------------
    def find_volume_by_name(
        self,
        name: str,
        parameters: VolumeParameters | None = None,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
    ) -> Volume | None:
        transport = parameters.transport if parameters is not None else "tcp"
        scope = partial(self._could_hold, transport=transport, requirement=requirement, source=source)
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
            return volume_of(entry, self._client(entry).get_volume(held.uuid))
        except NotFound:
            return None

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
        could_hold = partial(self._could_hold, transport=transport, requirement=requirement, source=source)
        held = self._names.find(name, could_hold)
        if held is None:
            if source is not None:
                entry = self._source_agent(source, transport, requirement)
            else:
                entry = self._place(capacity_bytes, transport, requirement, parameters)
            held = self._names.reserve(name, str(uuidlib.uuid4()), entry.name, could_hold)
        elif not held.kept_on:  # a volume made before reservations: keep what exists
            held = self._names.reserve(name, held.uuid, held.agent, could_hold)
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

    @staticmethod
    def _could_hold(
        entry: AgentEntry, transport: str, requirement: TopologyRequirement | None, source: ContentSource | None
    ) -> bool:
        """Could a CreateVolume with these arguments have put its volume on ``entry``?"""
        if source is not None:
            return entry.name == source.ref.location
        if transport not in entry.transports:
            return False
        if requirement is None or not requirement.requisite:
            return True
        return any(reachable(entry, transport, segment) for segment in requirement.requisite)

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

    def _source_agent(
        self, source: ContentSource, transport: str, requirement: TopologyRequirement | None
    ) -> AgentEntry:
        entry = self._entry(source.ref.location)
        if entry is None:
            raise NotFound(f"{source.kind} {source.ref.uuid} does not exist (unknown agent {source.ref.location})")
        if (
            requirement
            and requirement.requisite
            and not any(reachable(entry, transport, t) for t in requirement.requisite)
        ):
            raise ResourceExhausted(
                f"the {source.kind} lives on {entry.name}, which the requested topology cannot reach"
            )
        return entry

    def get_volume(self, ref: VolumeRef) -> Volume | None:
        entry = self._entry(ref.location)
        if entry is None:
            return None
        try:
            return volume_of(entry, self._client(entry).get_volume(ref.uuid))
        except NotFound:
            return None

    def list_volumes(self) -> list[Volume]:
        volumes = [volume_of(e, v) for e in self.fabric.agents for v in self._client(e).list_volumes()]
        return sorted(volumes, key=lambda v: v.ref.uuid)

    def delete_volume(self, ref: VolumeRef) -> None:
        entry = self._entry(ref.location)
        if entry is None:
            return
        client = self._client(entry)
        try:
            vol = client.get_volume(ref.uuid)
            self._names.release(vol.name, vol.uuid, vol.labels.get(KEPT_ON_LABEL, ""))  # first: see the module
        except NotFound:
            pass  # gone, or a delete the agent has not finished: finishing it is the agent's (idempotent) call
        client.delete_volume(ref.uuid)
        self.capacity_seen.forget(entry.name)  # space came back: read it again at the next placement

    def expand_volume(self, ref: VolumeRef, capacity_bytes: int) -> int:
        entry = self._require(ref)
        size = int(self._client(entry).resize_volume(ref.uuid, capacity_bytes).capacity_bytes)
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
        host = host_nqn_of(node_id)
        # an `auth` volume's agent issues the host's keys; the grant records the host's Node
        self._client(self._require(ref)).allow_host(ref.uuid, host, readonly=readonly, node_name=node_name)
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
            self._client(entry).deny_host(ref.uuid, host_nqn_of(node_id))
        except NotFound:
            return

    def fence(self, ref: VolumeRef, node_id: str, reason: str, boot_id: str) -> None:
        self._client(self._require(ref)).fence_host(ref.uuid, host_nqn_of(node_id), reason, boot_id)

    def unfence(self, ref: VolumeRef, node_id: str) -> None:
        self._client(self._require(ref)).unfence_host(ref.uuid, host_nqn_of(node_id))

    def condition(self, ref: VolumeRef) -> Condition:
        """The agent's view: unreachable -> inaccessible; not ready -> degraded; then what the agent reports
        about the volume itself (subsystem, namespace, ports, backing file, pool: ``agent/health.py``)."""
        entry = self._require(ref)
        try:
            health = self._client(entry).health()
            vol = self._client(entry).get_volume(ref.uuid)
        except Unavailable as err:
            message = f"agent {entry.name} unreachable: {err}"
            return Condition(True, message, (Problem("inaccessible", "AgentUnreachable", message),))
        problems = [Problem(i.status, i.reason, i.message) for i in vol.health]
        if not health.ready:
            problems.append(Problem("degraded", "AgentNotReady", f"agent {entry.name} not ready: {health.message}"))
        if not problems:
            return Condition(False, f"ready on agent {entry.name}")
        return Condition(True, "; ".join(p.message for p in problems), tuple(problems))

    # -- snapshots -----------------------------------------------------------------------------------------
    def create_snapshot(self, name: str, source: VolumeRef) -> Snapshot:
        entry = self._require(source)
        made = self._client(entry).create_snapshot(name, source.uuid)
        self.capacity_seen.forget(entry.name)  # a snapshot takes pool space (a copy of the source's blocks)
        return snapshot_of(entry, made)

    def find_snapshot_by_name(self, name: str) -> Snapshot | None:
        return next((s for s in self.list_snapshots() if s.name == name), None)

    def get_snapshot(self, ref: VolumeRef) -> Snapshot | None:
        entry = self._entry(ref.location)
        if entry is None:
            return None
        snaps = self._client(entry).list_snapshots(snapshot_uuid=ref.uuid)
        return snapshot_of(entry, snaps[0]) if snaps else None

    def delete_snapshot(self, ref: VolumeRef) -> None:
        entry = self._entry(ref.location)
        if entry is not None:
            self._client(entry).delete_snapshot(ref.uuid)
            self.capacity_seen.forget(entry.name)

    def list_snapshots(self) -> list[Snapshot]:
        snaps = [snapshot_of(e, s) for e in self.fabric.agents for s in self._client(e).list_snapshots()]
        return sorted(snaps, key=lambda s: s.ref.uuid)
