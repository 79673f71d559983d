"""The agent's desired state: every volume, snapshot, host grant and portal-group ANA state, saved before
configfs or the pool is touched.

Layout (one small JSON file per record, so saving a change costs the same with 10 or 10,000 volumes and never
rewrites another volume's record): ``<folder>/volumes/<uuid>.json``, ``<folder>/snapshots/<uuid>.json``,
``<folder>/ana.json``. Each file is written atomically (temp file, fsync, rename, fsync the folder); a removed
record is unlinked and the folder fsynced. A state saved by an older agent as one document
(``<folder>/agent-state.json``) is split into record files on load, the document removed last.

Contract: :class:`StateStore` loads the last saved state (an empty state when none exists);
:meth:`StateStore.commit` is durable when it returns and writes only the records the change replaced or
removed. Records are immutable; the agent replaces them. Secrets (DH-HMAC-CHAP keys) are stored in the
record files with mode 0600 and never logged. A record file that cannot be read, or whose name is not its
record's UUID, stops the load with ``DriverError`` (never a silently smaller state).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.atomic import fsync_dir, read_json, remove_durably, write_atomic

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


LEGACY_DOCUMENT = "agent-state.json"
KINDS = ("volumes", "snapshots")


def record_json(rec: VolumeRecord | SnapshotRecord) -> bytes:
    """One record as the bytes of its file (mappings and tuples as JSON objects and lists)."""
    doc: dict[str, Any] = {"version": FORMAT_VERSION}
    for f in fields(rec):
        value = getattr(rec, f.name)
        doc[f.name] = dict(value) if isinstance(value, Mapping) else list(value) if isinstance(value, tuple) else value
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def _volume(doc: Mapping[str, Any]) -> VolumeRecord:
    return VolumeRecord(**{**doc, "readonly_hosts": tuple(doc.get("readonly_hosts", ()))})


class StateStore:
    """The state in ``folder`` (see the module's layout), with an in-memory copy; commits are serialised."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        for kind in KINDS:
            (folder / kind).mkdir(parents=True, exist_ok=True)
        self._migrate()
        self._state = self._load()

    def _load(self) -> AgentState:
        parsed: dict[str, dict[str, Any]] = {}
        for kind, build in (("volumes", _volume), ("snapshots", lambda d: SnapshotRecord(**d))):
            parsed[kind] = {}
            for path in sorted((self.folder / kind).iterdir()):
                if path.name.startswith("."):  # a temp file of an interrupted write: never complete
                    path.unlink(missing_ok=True)
                    continue
                parsed[kind][path.stem] = self._read_record(path, build)
        ana = read_json(self.folder / "ana.json") or {}
        return AgentState(volumes=parsed["volumes"], snapshots=parsed["snapshots"], ana=dict(ana))

    @staticmethod
    def _read_record(path: Path, build: Callable[[dict[str, Any]], Any]) -> Any:
        try:
            doc = json.loads(path.read_text())
            if doc.pop("version", None) != FORMAT_VERSION:
                raise DriverError(f"agent state record {path} has format {doc.get('version')!r}, not {FORMAT_VERSION}")
            rec = build(doc)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise DriverError(f"agent state record {path} is unreadable: {exc!r}") from exc
        if path.name != f"{rec.uuid}.json":
            raise DriverError(f"agent state record {path} holds {rec.uuid}: refusing to load a misnamed record")
        return rec

    def _migrate(self) -> None:
        """Split a one-document state of an older agent into record files (the document removed last)."""
        legacy = self.folder / LEGACY_DOCUMENT
        doc = read_json(legacy)
        if doc is None:
            return
        try:
            state = AgentState.from_json(doc)
        except (TypeError, KeyError) as exc:
            raise DriverError(f"agent state {legacy} is unreadable: {exc!r}") from exc
        self._persist(AgentState(), state)
        remove_durably(legacy)

    @property
    def current(self) -> AgentState:
        return self._state

    def commit(self, change: Callable[[AgentState], AgentState]) -> AgentState:
        """Apply ``change`` to the current state, persist what it changed durably, then make it current."""
        with self._lock:
            state = change(self._state)
            self._persist(self._state, state)
            self._state = state
            return state

    def _persist(self, old: AgentState, new: AgentState) -> None:
        for kind in KINDS:
            before, after = getattr(old, kind), getattr(new, kind)
            folder = self.folder / kind
            for key, rec in after.items():
                if before.get(key) is not rec:
                    write_atomic(folder / f"{key}.json", record_json(rec))
            gone = [key for key in before if key not in after]
            for key in gone:
                (folder / f"{key}.json").unlink(missing_ok=True)
            if gone:
                fsync_dir(folder)
        if old.ana != new.ana:
            write_atomic(self.folder / "ana.json", (json.dumps(dict(new.ana), sort_keys=True) + "\n").encode())
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
