"""Controller logic, written once for every backend: create by name, capacity ranges, publish, list,
capacity, expansion.

Contract: every method is idempotent (repeating it reaches the same state and returns the same answer);
callers hold the per-volume/per-name lock; errors are ``nvmeof_csi.errors`` classes.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from nvmeof_csi.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
)
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import (
    NO_SECRETS,
    Condition,
    ContentSource,
    NodeDirectory,
    Snapshot,
    TargetBackend,
    Topology,
    TopologyRequirement,
    Volume,
    VolumeRef,
)
from nvmeof_csi.service.fencing import FENCE_ON_CHOICES, NoCluster, NodeFacts, fence_reason, may_unfence, needs_taint

T = TypeVar("T")
MiB = 1 << 20
GiB = 1 << 30
DEFAULT_SIZE = 1 * GiB
ALIGN = 1 * MiB


@dataclass(frozen=True)
class CapacityRange:
    """CSI capacity range in bytes; 0 means "not set"."""

    required: int = 0
    limit: int = 0

    def check(self) -> None:
        if self.required < 0 or self.limit < 0:
            raise InvalidArgument("capacity_range: required_bytes and limit_bytes must not be negative")
        if self.limit and self.required > self.limit:
            raise InvalidArgument(
                f"capacity_range: required_bytes {self.required} is larger than limit_bytes {self.limit}"
            )

    def admits(self, size: int) -> bool:
        return size >= self.required and (not self.limit or size <= self.limit)


def choose_size(cap: CapacityRange, max_size: int) -> int:
    """The size to provision for ``cap``: the required size (default 1 GiB) rounded up to 1 MiB, within the
    limit. Raises ``OutOfRange`` when the range cannot be met."""
    cap.check()
    size = cap.required or min(DEFAULT_SIZE, cap.limit or DEFAULT_SIZE)
    size = -(-size // ALIGN) * ALIGN
    if cap.limit and size > cap.limit:
        size = cap.limit  # an unaligned limit below the next MiB: take the limit itself
        if size < cap.required:
            raise OutOfRange(f"no size satisfies capacity range {cap.required}..{cap.limit}")
    if size > max_size:
        raise OutOfRange(f"{size} bytes requested, the largest volume here is {max_size} bytes")
    return size


@dataclass(frozen=True)
class Page:
    volumes: list[Volume]
    next_token: str


@dataclass(frozen=True)
class SnapshotPage:
    snapshots: list[Snapshot]
    next_token: str


def _after(items: list[T], token: str, key: Callable[[T], str], max_entries: int) -> tuple[list[T], str]:
    """One page of ``items`` (sorted by ``key``) after ``token`` (the last key of the previous page)."""
    if max_entries < 0:
        raise InvalidArgument("max_entries must not be negative")
    items = sorted(items, key=key)
    if token:
        try:
            after = str(uuidlib.UUID(token))
        except ValueError as exc:
            raise Aborted(f"starting_token {token!r} is not one this driver issued") from exc
        items = [i for i in items if key(i) > after]
    if max_entries and len(items) > max_entries:
        return items[:max_entries], key(items[max_entries - 1])
    return items, ""


class VolumeService:
    """Backend-agnostic controller operations over an injected :class:`TargetBackend`."""

    def __init__(
        self,
        backend: TargetBackend,
        nodes: NodeDirectory,
        max_volumes_per_node: int = 0,
        facts: NodeFacts | None = None,
        fence_on: frozenset[str] = frozenset(FENCE_ON_CHOICES),
    ) -> None:
        """``facts`` and ``fence_on``: when an unpublish fences and when a fenced node may publish again
        (``service/fencing.py``); without ``facts`` there is no cluster to ask."""
        self._backend = backend
        self._nodes = nodes
        self._max_per_node = max_volumes_per_node
        self._facts: NodeFacts = facts or NoCluster()
        self._fence_on = fence_on

    def create(
        self,
        name: str,
        cap: CapacityRange,
        parameters: VolumeParameters,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
        wait: float | None = None,
    ) -> Volume:
        """Create ``name`` or return the existing compatible volume; incompatible existing -> ALREADY_EXISTS.
        ``wait`` bounds the wait for a volume still being filled (see ``TargetBackend.create_volume``).
        A volume from a source is at least as large as the source."""
        cap.check()
        existing = self._backend.find_volume_by_name(name, parameters, requirement, source)
        if existing is not None:
            if not cap.admits(existing.capacity_bytes):
                raise AlreadyExists(
                    f"volume {name!r} exists with {existing.capacity_bytes} bytes, outside the requested range"
                )
            if existing.parameters.immutable() != parameters.immutable():  # mutable ones may have changed since
                raise AlreadyExists(f"volume {name!r} exists with different parameters")
            if existing.source != source:
                raise AlreadyExists(f"volume {name!r} exists with a different content source")
            if existing.ready:
                return existing
            return self._backend.create_volume(name, existing.capacity_bytes, parameters, None, source, wait)
        if source is not None:
            cap = CapacityRange(max(cap.required, self._source_size(source)), cap.limit)
        size = choose_size(cap, self._backend.max_volume_size())
        return self._backend.create_volume(name, size, parameters, requirement, source, wait)

    def _source_size(self, source: ContentSource) -> int:
        if source.kind == "snapshot":
            snap = self._backend.get_snapshot(source.ref)
            if snap is None:
                raise NotFound(f"snapshot {source.ref.uuid} does not exist")
            return snap.size_bytes
        return self.get(source.ref).capacity_bytes

    def get(self, ref: VolumeRef) -> Volume:
        volume = self._backend.get_volume(ref)
        if volume is None:
            raise NotFound(f"volume {ref.uuid} does not exist")
        return volume

    def delete(self, ref: VolumeRef) -> None:
        self._backend.delete_volume(ref)

    def publish(
        self,
        ref: VolumeRef,
        node_id: str,
        readonly: bool,
        secrets: Mapping[str, str] = NO_SECRETS,
        one_node: bool = False,
    ) -> Mapping[str, str]:
        """Allow ``node_id`` on the volume. ``one_node`` (a SINGLE_NODE_* access mode): FAILED_PRECONDITION while
        another node has it published, as the CSI spec asks (the other node must be unpublished first).
        FAILED_PRECONDITION too while several Nodes claim ``node_id`` (one host identity on several machines)."""
        volume = self.get(ref)
        if not self._nodes.knows(node_id):
            raise NotFound(f"node {node_id!r} is not known to this controller")
        claimants = self._facts.claimed_by(node_id)
        if len(claimants) > 1:  # the target tells hosts apart by NQN alone: it would open the volume to all
            raise FailedPrecondition(
                f"node ID {node_id!r} is claimed by {len(claimants)} Nodes ({', '.join(claimants[:4])}): one NVMe "
                "host identity on several machines (a cloned /etc/nvme/hostnqn or node state folder); give each "
                "its own (on all but one: delete /etc/nvme/hostnqn, /etc/nvme/hostid and the node's "
                "host-identity.json, then restart its node plugin)"
            )
        fence = volume.fenced.get(node_id)
        if fence is not None:
            if not may_unfence(fence.boot_id, self._facts.boot_id(node_id)):
                raise FailedPrecondition(
                    f"node {node_id!r} is fenced from volume {ref.uuid} ({fence.reason}): it gets the volume again "
                    f"once it has rebooted (a new boot ID) or an operator ran: nvmeofctl hosts unfence {ref.uuid} "
                    f"{node_id}"
                )
            self._backend.unfence(ref, node_id)
        others = sorted(n for n in volume.published_nodes if n != node_id)
        if one_node and others:
            raise FailedPrecondition(
                f"volume {ref.uuid} is published to node {others[0]!r} and its access mode allows one node at a "
                "time: unpublish it there first"
            )
        if self._max_per_node and node_id not in volume.published_nodes:
            attached = sum(1 for v in self._backend.list_volumes() if node_id in v.published_nodes)
            if attached >= self._max_per_node:
                raise ResourceExhausted(
                    f"node {node_id!r} already has {attached} volumes published (limit {self._max_per_node})"
                )
        return self._backend.publish(ref, node_id, readonly, secrets, node_name=self._facts.node_of(node_id))

    def unpublish(self, ref: VolumeRef, node_id: str, reason: str = "") -> str:
        """Revoke ``node_id``'s access, fencing it when ``reason`` (a CSI 1.14 unpublish reason name, ``""``
        unset) or its Node's taint says so (``service/fencing.py``); returns the fence's reason, ``""`` when it
        did not fence."""
        if self._backend.get_volume(ref) is None:
            return ""  # gone: nothing is published
        tainted = self._facts.out_of_service(node_id) if needs_taint(reason, self._fence_on) else None
        why = fence_reason(reason, self._fence_on, tainted)
        if why:
            self._backend.fence(ref, node_id, why, self._facts.boot_id(node_id))
        else:
            self._backend.unpublish(ref, node_id)
        return why

    def list(self, max_entries: int, starting_token: str) -> Page:
        """Volumes ordered by UUID; the token is the UUID of the last volume returned, so deleting it or
        adding volumes between pages neither repeats nor loses any volume that existed throughout."""
        volumes, token = _after(self._backend.list_volumes(), starting_token, lambda v: v.ref.uuid, max_entries)
        return Page(volumes, token)

    def capacity(self, segment: Topology | None, parameters: VolumeParameters | None = None) -> int:
        return self._backend.available_capacity(segment, parameters)

    def max_volume_size(self) -> int:
        return self._backend.max_volume_size()

    def expand(self, ref: VolumeRef, cap: CapacityRange) -> int:
        cap.check()
        volume = self.get(ref)
        if volume.capacity_bytes >= cap.required:
            return volume.capacity_bytes  # already large enough; volumes never shrink
        size = choose_size(CapacityRange(max(cap.required, volume.capacity_bytes), cap.limit), self.max_volume_size())
        return self._backend.expand_volume(ref, size)

    def modify(self, ref: VolumeRef, changes: Mapping[str, str]) -> None:
        """ControllerModifyVolume: ``changes`` are validated mutable parameters; an empty map changes nothing."""
        self.get(ref)
        if changes:
            self._backend.modify_volume(ref, changes)

    def condition(self, ref: VolumeRef) -> Condition:
        self.get(ref)
        return self._backend.condition(ref)

    # -- snapshots -----------------------------------------------------------------------------------------
    def create_snapshot(self, name: str, source: VolumeRef) -> Snapshot:
        """Snapshot ``source`` as ``name`` or return the existing one; same name, other source -> ALREADY_EXISTS."""
        existing = self._backend.find_snapshot_by_name(name)
        if existing is not None:
            if existing.source != source:
                raise AlreadyExists(f"snapshot {name!r} exists for another volume")
            return existing
        self.get(source)
        return self._backend.create_snapshot(name, source)

    def delete_snapshot(self, ref: VolumeRef) -> None:
        self._backend.delete_snapshot(ref)

    def list_snapshots(
        self, max_entries: int, starting_token: str, source: VolumeRef | None = None, snapshot: VolumeRef | None = None
    ) -> SnapshotPage:
        """Snapshots by UUID, optionally of one source volume or one snapshot; tokens as in :meth:`list`."""
        snaps = self._backend.list_snapshots()
        if source is not None:
            snaps = [s for s in snaps if s.source == source]
        if snapshot is not None:
            snaps = [s for s in snaps if s.ref == snapshot]
        page, token = _after(snaps, starting_token, lambda s: s.ref.uuid, max_entries)
        return SnapshotPage(page, token)

    @property
    def supports_snapshots(self) -> bool:
        return self._backend.supports_snapshots
