"""The agent's desired state: every volume, snapshot, host grant and portal-group ANA state, in one JSON
document written atomically (temp file, fsync, rename, fsync the folder) before configfs or the pool is
touched.

Contract: :meth:`StateStore.load` returns the last saved document (an empty state when none exists);
:meth:`StateStore.save` is durable when it returns. Records are immutable; the agent replaces them.
Secrets (DH-HMAC-CHAP keys) are stored here with file mode 0600 and never logged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.atomic import read_json, write_json_atomic

FORMAT_VERSION = 1
CREATING, READY, DELETING = "creating", "ready", "deleting"


@dataclass(frozen=True)
class VolumeRecord:
    uuid: str
    name: str
    capacity_bytes: int
    parameters: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    hosts: Mapping[str, str] = field(default_factory=dict)  # host NQN -> DH-HMAC-CHAP key ("" = none)
    ctrl_keys: Mapping[str, str] = field(default_factory=dict)  # host NQN -> bidirectional controller key
    readonly_hosts: tuple[str, ...] = ()
    source_volume: str = ""
    source_snapshot: str = ""
    status: str = CREATING
    created_at: float = 0.0

    def evolve(self, **changes: Any) -> VolumeRecord:
        return replace(self, **changes)


@dataclass(frozen=True)
class SnapshotRecord:
    uuid: str
    name: str
    source_volume: str
    size_bytes: int
    status: str = CREATING
    created_at: float = 0.0

    def evolve(self, **changes: Any) -> SnapshotRecord:
        return replace(self, **changes)


@dataclass(frozen=True)
class AgentState:
    volumes: Mapping[str, VolumeRecord] = field(default_factory=dict)
    snapshots: Mapping[str, SnapshotRecord] = field(default_factory=dict)
    ana: Mapping[str, str] = field(default_factory=dict)  # portal group -> ANA state

    def with_volume(self, rec: VolumeRecord) -> AgentState:
        return replace(self, volumes={**self.volumes, rec.uuid: rec})

    def without_volume(self, vol_uuid: str) -> AgentState:
        return replace(self, volumes={k: v for k, v in self.volumes.items() if k != vol_uuid})

    def with_snapshot(self, rec: SnapshotRecord) -> AgentState:
        return replace(self, snapshots={**self.snapshots, rec.uuid: rec})

    def without_snapshot(self, snap_uuid: str) -> AgentState:
        return replace(self, snapshots={k: v for k, v in self.snapshots.items() if k != snap_uuid})

    def with_ana(self, group: str, state: str) -> AgentState:
        return replace(self, ana={**self.ana, group: state})

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "volumes": {k: asdict(v) for k, v in sorted(self.volumes.items())},
            "snapshots": {k: asdict(v) for k, v in sorted(self.snapshots.items())},
            "ana": dict(sorted(self.ana.items())),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentState:
        if doc.get("version") != FORMAT_VERSION:
            raise DriverError(f"agent state format {doc.get('version')!r} is not {FORMAT_VERSION}")
        return cls(
            volumes={k: VolumeRecord(**{**v, "readonly_hosts": tuple(v.get("readonly_hosts", ()))})
                     for k, v in doc.get("volumes", {}).items()},
            snapshots={k: SnapshotRecord(**v) for k, v in doc.get("snapshots", {}).items()},
            ana=dict(doc.get("ana", {})),
        )


class StateStore:
    """The state document at ``path``, with an in-memory copy; ``update`` is serialised by a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        doc = read_json(path)
        try:
            self._state = AgentState.from_json(doc) if doc is not None else AgentState()
        except (TypeError, KeyError) as exc:
            raise DriverError(f"agent state {path} is unreadable: {exc!r}") from exc

    @property
    def current(self) -> AgentState:
        return self._state

    def commit(self, change: Callable[[AgentState], AgentState]) -> AgentState:
        """Apply ``change`` to the current state, persist the result durably, then make it current."""
        with self._lock:
            state = change(self._state)
            write_json_atomic(self.path, state.to_json())
            self._state = state
            return state

    def put_volume(self, rec: VolumeRecord) -> VolumeRecord:
        self.commit(lambda s: s.with_volume(rec))
        return rec

    def drop_volume(self, vol_uuid: str) -> None:
        self.commit(lambda s: s.without_volume(vol_uuid))

    def put_snapshot(self, rec: SnapshotRecord) -> SnapshotRecord:
        self.commit(lambda s: s.with_snapshot(rec))
        return rec

    def drop_snapshot(self, snap_uuid: str) -> None:
        self.commit(lambda s: s.without_snapshot(snap_uuid))

    def put_ana(self, group: str, ana_state: str) -> None:
        self.commit(lambda s: s.with_ana(group, ana_state))
