"""The interfaces every backend implements, and the domain values that cross them.

Two sides:
- :class:`TargetBackend` (controller side): where volumes live. The development ``loop`` backend and the
  NVMe-oF agent backend implement it.
- :class:`Connector` (node side): how a node reaches a volume's block device. ``loop`` (losetup) and the
  kernel NVMe-oF initiator implement it.

Shared contracts, for every method unless it says otherwise:
- **Idempotency**: repeating a call with the same arguments reaches the same state and returns the same
  result; deleting/disconnecting something absent succeeds.
- **Concurrency**: callers hold the per-volume lock (see ``csi/locks.py``); implementations serialise only
  their own shared objects (ports, pools, connection sets).
- **Errors**: implementations raise ``nvmeof_csi.errors`` classes only (``NotFound``, ``ResourceExhausted``,
  ``Unavailable``, ``CommandError`` ...); never gRPC errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from nvmeof_csi.nvmeof.parameters import VolumeParameters

Topology = Mapping[str, str]
#: "no CSI secrets" (read-only, so a shared default can never be changed by a callee)
NO_SECRETS: Mapping[str, str] = MappingProxyType({})
_LOCATION = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def valid_location(location: str) -> bool:
    """A location (backend or agent name, fabric name) is a DNS label: it is encoded in volume IDs."""
    return _LOCATION.fullmatch(location) is not None


def valid_node_name(name: str) -> bool:
    """A Kubernetes Node name: a DNS subdomain (dot-separated labels, at most 253 characters)."""
    return len(name) <= 253 and all(_LOCATION.fullmatch(label) for label in name.split("."))


@dataclass(frozen=True)
class VolumeRef:
    """Where a volume lives (``location``: a backend/agent name) and its UUID; encoded in the CSI volume ID."""

    location: str
    uuid: str


@dataclass(frozen=True)
class ContentSource:
    """What a new volume is filled from: a snapshot or another volume (``kind`` "snapshot" | "volume")."""

    kind: str
    ref: VolumeRef


@dataclass(frozen=True)
class TopologyRequirement:
    """CSI accessibility requirements: ``requisite`` must be met; ``preferred`` is tried in order."""

    requisite: tuple[Topology, ...] = ()
    preferred: tuple[Topology, ...] = ()


@dataclass(frozen=True)
class Volume:
    """A provisioned volume as a backend reports it."""

    ref: VolumeRef
    name: str
    capacity_bytes: int
    parameters: VolumeParameters = field(default_factory=VolumeParameters)
    context: Mapping[str, str] = field(default_factory=dict)  # what a node needs to connect
    accessible_topology: tuple[Topology, ...] = ()
    published_nodes: tuple[str, ...] = ()
    source: ContentSource | None = None
    ready: bool = True  # False while the backend is still creating it (e.g. filling a dataset volume)
    fenced: Mapping[str, Fence] = field(default_factory=dict)  # node ID -> its fence from this volume


@dataclass(frozen=True)
class Fence:
    """A node fenced from a volume: why, when (the target's clock) and the node's boot ID then ("" unknown)."""

    reason: str
    at: float
    boot_id: str = ""


@dataclass(frozen=True)
class Snapshot:
    """A point-in-time copy of a volume (``ref.location`` is where it lives, with its source)."""

    ref: VolumeRef
    name: str
    source: VolumeRef
    size_bytes: int
    created_at: float
    ready: bool = True


@dataclass(frozen=True)
class Health:
    """Readiness of a backend or connector; ``message`` says why when not ready; ``gaps``: what it cannot serve
    although ready (a feature it was asked for that this machine lacks, with the fix)."""

    ready: bool
    message: str = ""
    gaps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a volume: ``status`` is ``degraded``, ``inaccessible`` or ``data-loss``; ``reason``
    a CamelCase word for machines (unique per status); ``message`` what an operator can act on."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class OrphanStats:
    """Subsystems of the driver that nothing claims and that are still connected because their release failed
    (``unreleased``), and how many releases failed since the node plugin started (``failures``)."""

    unreleased: int = 0
    failures: int = 0


@dataclass(frozen=True)
class Condition:
    """Health of one volume as seen from a node or a target: ``problems`` (empty: nothing known to be wrong)
    and a one-line summary."""

    abnormal: bool
    message: str
    problems: tuple[Problem, ...] = ()

    def issues(self) -> tuple[Problem, ...]:
        """The problems; an abnormal condition that names none is one ``degraded`` ``Abnormal`` problem."""
        if self.problems or not self.abnormal:
            return self.problems
        return (Problem("degraded", "Abnormal", self.message),)


class TargetBackend(Protocol):
    """Controller-side storage. See the module docstring for the shared contracts."""

    def health(self) -> Health:
        """Cheap readiness check (Probe)."""
        ...

    supports_snapshots: bool

    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: VolumeParameters,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
        wait: float | None = None,
    ) -> Volume:
        """Create a volume recorded under ``name`` where ``requirement`` allows (filled from ``source``);
        returns the existing one if ``name`` exists (the caller checks compatibility). Raises
        ``ResourceExhausted`` when no reachable place has capacity, ``NotFound`` for a missing source.
        A volume that takes long to fill (a data set) is waited for at most ``wait`` seconds (the caller's
        deadline; ``None``: the backend's own bound), then ``Aborted`` says it is still being filled and the
        fill goes on: a retry returns it once it is ready. No thread is held for the whole fill."""
        ...

    def find_volume_by_name(
        self,
        name: str,
        parameters: VolumeParameters | None = None,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
    ) -> Volume | None:
        """The volume recorded under ``name``. Given the arguments of the CreateVolume that asks, places that
        such a create could never have used may be skipped when they cannot be reached (instead of UNAVAILABLE)."""
        ...

    def get_volume(self, ref: VolumeRef) -> Volume | None: ...

    def list_volumes(self) -> list[Volume]:
        """All volumes in a stable order (by UUID), so pagination tokens stay valid."""
        ...

    def delete_volume(self, ref: VolumeRef) -> None:
        """Delete; absent is success. Raises ``FailedPrecondition`` while still published."""
        ...

    def expand_volume(self, ref: VolumeRef, capacity_bytes: int) -> int:
        """Grow to at least ``capacity_bytes``; returns the new size. Never shrinks."""
        ...

    def modify_volume(self, ref: VolumeRef, changes: Mapping[str, str]) -> None:
        """Record new values of the volume's mutable parameters (validated by the caller); idempotent;
        ``NotFound`` for an unknown volume."""
        ...

    def publish(
        self,
        ref: VolumeRef,
        node_id: str,
        readonly: bool,
        secrets: Mapping[str, str] = NO_SECRETS,
        node_name: str = "",
    ) -> Mapping[str, str]:
        """Allow ``node_id`` to reach the volume; returns the publish context. Already published to that node
        with another ``readonly`` raises ``AlreadyExists``. ``secrets`` is the CSI controller-publish secret; no
        backend needs one (an ``auth`` volume's agent issues the host's keys) and it is never logged.
        ``node_name``: the Kubernetes Node that ``node_id`` is (``""``: unknown), recorded with the grant: the
        host's keys go to a certificate of that Node only."""
        ...

    def unpublish(self, ref: VolumeRef, node_id: str) -> None:
        """Revoke ``node_id``'s access; not published is success."""
        ...

    def fence(self, ref: VolumeRef, node_id: str, reason: str, boot_id: str) -> None:
        """Revoke ``node_id``'s access *now*: refused from now on and every connection it has to the volume
        ended, so that a node presumed lost writes nothing more; it stays refused (``publish`` raises
        ``FailedPrecondition``) until :meth:`unfence`. Idempotent; not published is fenced all the same."""
        ...

    def unfence(self, ref: VolumeRef, node_id: str) -> None:
        """Lift ``node_id``'s fence (it is not published by this); not fenced is success."""
        ...

    def available_capacity(self, segment: Topology | None, parameters: VolumeParameters | None = None) -> int:
        """Bytes that can still be provisioned for volumes with ``parameters`` (in ``segment`` when given; 0 if
        it cannot be reached)."""
        ...

    def max_volume_size(self) -> int: ...

    def condition(self, ref: VolumeRef) -> Condition: ...

    def create_snapshot(self, name: str, source: VolumeRef) -> Snapshot:
        """Snapshot ``source`` as ``name``; the existing snapshot if ``name`` exists (caller checks)."""
        ...

    def find_snapshot_by_name(self, name: str) -> Snapshot | None: ...

    def get_snapshot(self, ref: VolumeRef) -> Snapshot | None: ...

    def delete_snapshot(self, ref: VolumeRef) -> None:
        """Delete; absent is success."""
        ...

    def list_snapshots(self) -> list[Snapshot]:
        """All snapshots in a stable order (by UUID)."""
        ...


class Connector(Protocol):
    """Node-side access to a volume's block device. See the module docstring for the shared contracts."""

    def health(self) -> Health: ...

    def connect(
        self, ref: VolumeRef, context: Mapping[str, str], timeout: float, secrets: Mapping[str, str] = NO_SECRETS
    ) -> str:
        """Make the volume's block device present and return its path; "already connected" is success.
        Waits at most ``timeout`` seconds, then raises ``DeadlineExceeded``. ``secrets`` is the CSI node-stage
        secret (the DH-HMAC-CHAP secret of a volume with ``auth``): used for this connect, never stored."""
        ...

    def find_device(self, ref: VolumeRef, context: Mapping[str, str]) -> str | None:
        """The volume's block device if it is present now (verified to be this volume), else ``None``."""
        ...

    def disconnect(self, ref: VolumeRef, context: Mapping[str, str], in_use: frozenset[VolumeRef]) -> None:
        """Release the volume's connection; shared connections stay while another volume in ``in_use`` needs
        them. Absent is success."""
        ...

    def refresh_size(self, ref: VolumeRef, context: Mapping[str, str], device: str) -> int:
        """Make the device show the volume's current size (rescan); returns it in bytes."""
        ...

    def condition(self, ref: VolumeRef, context: Mapping[str, str]) -> Condition:
        """Path health of a connected volume (all paths live = normal)."""
        ...

    def check_context(self, ref: VolumeRef, context: Mapping[str, str]) -> None:
        """Raise ``DriverError`` when this connector could not use ``context`` for ``ref`` (no I/O)."""
        ...

    def refresh_keys(self, ref: VolumeRef, context: Mapping[str, str]) -> list[str]:
        """Bring a staged volume's live connections to its current credentials (a key roll); returns the actions."""
        ...

    def reconcile(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]], timeout: float) -> list[str]:
        """At start: reconnect missing paths of the ``claimed`` (staged) volumes, release what this driver
        connected that nothing claims, never touch anything else. Returns the actions taken. A release that
        fails is logged and remembered, never raised: one subsystem never stops the start."""
        ...

    def head_of(self, ref: VolumeRef) -> str | None:
        """The volume's device found by its ID alone (no context), or ``None`` when it is not connected here."""
        ...

    def release_volume(self, ref: VolumeRef, in_use: frozenset[VolumeRef]) -> list[str]:
        """NodeUnstage by volume ID, for a volume whose staging record was set aside (no context): disconnect its
        connections unless their device is in use or another staged volume (``in_use``) shares them; returns
        the actions, a kept connection named with the reason ("kept ...")."""
        ...

    def retry_orphans(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]]) -> list[str]:
        """The node's periodic pass: release again the subsystems whose release failed before and that none of
        ``claimed`` (the staged volumes now) claims; a failure is remembered again. Returns the actions."""
        ...

    def orphan_stats(self) -> OrphanStats:
        """What :meth:`reconcile` and :meth:`retry_orphans` could not release (for metrics)."""
        ...


class NodeDirectory(Protocol):
    """Which node IDs the controller may publish to (unknown node -> NOT_FOUND)."""

    def knows(self, node_id: str) -> bool: ...


@dataclass(frozen=True)
class StaticNodes:
    """A fixed set of node IDs (the embedded/development setup, where the one node is this host)."""

    node_ids: frozenset[str]

    def knows(self, node_id: str) -> bool:
        return node_id in self.node_ids
