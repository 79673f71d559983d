"""The agent's desired state: every volume, snapshot, host grant and portal-group ANA state, saved before configfs or
the pool is touched.

Layout (one small JSON file per record, so saving a change costs the same with 10 or 10,000 volumes and never
rewrites another volume's record): ``<folder>/volumes/<uuid>[.<status>].json`` and
``<folder>/snapshots/<uuid>[.<status>].json`` (no status part: ready; ``.creating`` / ``.deleting``), and
``<folder>/ana.json``. The status lives in the file name, so a status change alone (creating -> ready, ready ->
deleting) is one rename and a folder fsync, not a rewrite; a content change is an atomic rewrite (temp file, fsync,
rename, fsync the folder) under the record's current name, then the rename if the status changed too. A removed
record is unlinked and the folder fsynced, except when every removed record was ``deleting``: then the unlink is
left to the next fsync of the folder (a power cut that loses it brings back a ``deleting`` record, whose delete the
agent's start finishes again: every step of a teardown is idempotent), which saves a disk flush per delete. For
the same reason the agent may ask (``flush_renames=False``) not to flush a ``creating -> ready`` rename of a
volume that has nothing to fill: a lost rename brings back a ``creating`` volume, which the agent's start
finishes creating (every step idempotent, the image is durable already); a snapshot or a volume with a fill
always flushes (finishing those again would copy or fill again). A state saved by an older agent as one
document (``<folder>/agent-state.json``) is split into record files on load, the document removed last.
``<folder>/names/`` holds name reservations (``agent/names.py``), not records; a ``time-floor.json`` left by an
older agent is removed on load (name reservations replaced it).

Contract: :class:`StateStore` loads the last saved state (an empty state when none exists);
:meth:`StateStore.commit` is durable when it returns (a removed ``deleting`` record: see above) and writes only the
records the change replaced or removed. Commits of different records run their file work concurrently (no lock is
held across a write); callers serialise commits that touch the same record (the agent's per-volume keys do) and
portal-group ANA changes (its ports lock does). A commit's change becomes current only after its files are durable;
reading :attr:`StateStore.current` never writes or waits. Records are immutable; the agent replaces them. Secrets
(DH-HMAC-CHAP keys) are stored in the record files with mode 0600 and never logged. A record file that cannot
be read, is misnamed, or a record saved twice under two statuses, stops the load with ``DriverError`` (never a
silently smaller state).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypedDict

from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.atomic import fsync_dir, read_json, remove_durably, write_atomic

FORMAT_VERSION = 1
CREATING, READY, DELETING = "creating", "ready", "deleting"


class FenceMark(TypedDict):
    """A host fenced from a volume: why, when (agent clock), its boot ID then, and whether its teardown ended."""

    reason: str
    at: float
    boot_id: str
    done: bool


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
    fenced: Mapping[str, FenceMark] = field(default_factory=dict)  # host NQN -> its fence (``agent/fencing.py``)

    def evolve(self, **changes: Any) -> VolumeRecord:
        return replace(self, **changes)

    def without_host(self, host_nqn: str) -> VolumeRecord:
        """The record with ``host_nqn``'s grant gone: its keys and its read-only mark too."""
        return replace(
            self,
            hosts={k: v for k, v in self.hosts.items() if k != host_nqn},
            ctrl_keys={k: v for k, v in self.ctrl_keys.items() if k != host_nqn},
            readonly_hosts=tuple(h for h in self.readonly_hosts if h != host_nqn),
        )


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

    @cached_property
    def volume_order(self) -> list[str]:
        """Every volume's UUID, sorted; computed once per state (a state never changes), so paging through a
        listing sorts once, not once per page."""
        return sorted(self.volumes)

    def with_volume(self, rec: VolumeRecord) -> AgentState:
        return replace(self, volumes={**self.volumes, rec.uuid: rec})

    def without_volume(self, vol_uuid: str) -> AgentState:
        volumes = dict(self.volumes)
        volumes.pop(vol_uuid, None)
        return replace(self, volumes=volumes)

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
            volumes={
                k: VolumeRecord(**{**v, "readonly_hosts": tuple(v.get("readonly_hosts", ()))})
                for k, v in doc.get("volumes", {}).items()
            },
            snapshots={k: SnapshotRecord(**v) for k, v in doc.get("snapshots", {}).items()},
            ana=dict(doc.get("ana", {})),
        )


LEGACY_DOCUMENT = "agent-state.json"
OLD_FLOOR_FILE = "time-floor.json"  # written by agents before name reservations
KINDS = ("volumes", "snapshots")


Record = VolumeRecord | SnapshotRecord


def record_json(rec: Record) -> bytes:
    """One record as the bytes of its file, without its status (the file name holds it)."""
    doc: dict[str, Any] = {"version": FORMAT_VERSION}
    for f in fields(rec):
        if f.name == "status":
            continue
        value = getattr(rec, f.name)
        doc[f.name] = dict(value) if isinstance(value, Mapping) else list(value) if isinstance(value, tuple) else value
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def file_name(rec: Record) -> str:
    return f"{rec.uuid}.json" if rec.status == READY else f"{rec.uuid}.{rec.status}.json"


def _volume(doc: Mapping[str, Any]) -> VolumeRecord:
    return VolumeRecord(**{**doc, "readonly_hosts": tuple(doc.get("readonly_hosts", ()))})


def _snapshot(doc: Mapping[str, Any]) -> SnapshotRecord:
    return SnapshotRecord(**doc)


@dataclass(frozen=True)
class Delta:
    """What one commit changed: per kind, the records replaced or added (old, new) and removed (old)."""

    put: Mapping[str, Mapping[str, tuple[Record | None, Record]]]
    gone: Mapping[str, Mapping[str, Record]]
    ana: Mapping[str, str] | None  # the new ANA map when it changed

    @classmethod
    def between(cls, old: AgentState, new: AgentState) -> Delta:
        put: dict[str, dict[str, tuple[Record | None, Record]]] = {}
        gone: dict[str, dict[str, Record]] = {}
        for kind in KINDS:
            before, after = getattr(old, kind), getattr(new, kind)
            if before is after:  # the kind untouched (shared by both states): nothing to walk
                put[kind], gone[kind] = {}, {}
                continue
            put[kind] = {k: (before.get(k), r) for k, r in after.items() if before.get(k) is not r}
            gone[kind] = {k: r for k, r in before.items() if k not in after}
        return cls(put, gone, dict(new.ana) if new.ana != old.ana else None)

    @classmethod
    def of_record(cls, kind: str, old: Record | None, new: Record | None) -> Delta:
        """The change of one record of ``kind`` from ``old`` to ``new`` (``None``: absent); costs the record, not
        the state (a whole-state diff walks every record)."""
        put: dict[str, dict[str, tuple[Record | None, Record]]] = {k: {} for k in KINDS}
        gone: dict[str, dict[str, Record]] = {k: {} for k in KINDS}
        if new is not None and new is not old:
            put[kind][new.uuid] = (old, new)
        elif new is None and old is not None:
            gone[kind][old.uuid] = old
        return cls(put, gone, None)

    def onto(self, state: AgentState) -> AgentState:
        """``state`` with this change applied (other records, changed meanwhile by other commits, kept)."""
        merged = {}
        for kind in KINDS:
            if not self.put[kind] and not self.gone[kind]:
                merged[kind] = getattr(state, kind)  # unchanged: shared, not copied
                continue
            records = dict(getattr(state, kind))
            records.update({k: new for k, (_, new) in self.put[kind].items()})
            for k in self.gone[kind]:
                records.pop(k, None)
            merged[kind] = records
        return AgentState(
            volumes=merged["volumes"], snapshots=merged["snapshots"], ana=state.ana if self.ana is None else self.ana
        )


class StateStore:
    """The state in ``folder`` (see the module's layout), with an in-memory copy."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()  # guards the in-memory copy only, never held across file work
        for kind in KINDS:
            (folder / kind).mkdir(parents=True, exist_ok=True)
        self._migrate()
        self._state = self._load()

    def _load(self) -> AgentState:
        parsed: dict[str, dict[str, Any]] = {}
        for kind, build in (("volumes", _volume), ("snapshots", _snapshot)):
            parsed[kind] = {}
            for path in sorted((self.folder / kind).iterdir()):
                if path.name.startswith("."):  # a temp file of an interrupted write: never complete
                    path.unlink(missing_ok=True)
                    continue
                rec = self._read_record(path, build)
                if rec.uuid in parsed[kind]:
                    raise DriverError(
                        f"agent state: {kind} record {rec.uuid} is saved twice ({path.name} and "
                        f"{file_name(parsed[kind][rec.uuid])}); refusing to guess"
                    )
                parsed[kind][rec.uuid] = rec
        ana = read_json(self.folder / "ana.json") or {}
        return AgentState(volumes=parsed["volumes"], snapshots=parsed["snapshots"], ana=dict(ana))

    @staticmethod
    def _read_record(path: Path, build: Callable[[dict[str, Any]], Record]) -> Record:
        parts = path.name.split(".")
        status = parts[1] if len(parts) == 3 else READY
        try:
            doc = json.loads(path.read_text())
            if doc.pop("version", None) != FORMAT_VERSION:
                raise DriverError(f"agent state record {path} has format {doc.get('version')!r}, not {FORMAT_VERSION}")
            rec = build({**doc, "status": status})
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise DriverError(f"agent state record {path} is unreadable: {exc!r}") from exc
        if status not in (CREATING, DELETING, READY) or path.name != file_name(rec):
            raise DriverError(f"agent state record {path} holds {rec.uuid}: refusing to load a misnamed record")
        return rec

    def _migrate(self) -> None:
        """Split a one-document state of an older agent into record files (the document removed last)."""
        self._forget_floor()
        legacy = self.folder / LEGACY_DOCUMENT
        doc = read_json(legacy)
        if doc is None:
            return
        try:
            state = AgentState.from_json(doc)
        except (TypeError, KeyError) as exc:
            raise DriverError(f"agent state {legacy} is unreadable: {exc!r}") from exc
        self._persist(Delta.between(AgentState(), state))
        remove_durably(legacy)

    def _forget_floor(self) -> None:
        if (self.folder / OLD_FLOOR_FILE).exists():
            remove_durably(self.folder / OLD_FLOOR_FILE)

    @property
    def current(self) -> AgentState:
        return self._state

    def commit(self, change: Callable[[AgentState], AgentState], flush_renames: bool = True) -> AgentState:
        """Apply ``change`` to the current state, persist what it changed durably, then make it current;
        returns the current state with the change in it. ``flush_renames=False``: a status change that is only
        a rename is not flushed (the caller knows that losing it is harmless, see the module docstring)."""
        return self._apply(lambda state: Delta.between(state, change(state)), flush_renames)

    def _apply(self, change: Callable[[AgentState], Delta], flush_renames: bool = True) -> AgentState:
        with self._lock:
            delta = change(self._state)
        self._persist(delta, flush_renames)
        with self._lock:
            self._state = delta.onto(self._state)
            return self._state

    def _persist(self, delta: Delta, flush_renames: bool = True) -> None:
        for kind in KINDS:
            folder = self.folder / kind
            for old, new in delta.put[kind].values():
                self._save(folder, old, new, flush_renames)
            for old in delta.gone[kind].values():
                (folder / file_name(old)).unlink(missing_ok=True)
            if any(old.status != DELETING for old in delta.gone[kind].values()):
                fsync_dir(folder)
        if delta.ana is not None:
            write_atomic(self.folder / "ana.json", (json.dumps(dict(delta.ana), sort_keys=True) + "\n").encode())

    @staticmethod
    def _save(folder: Path, old: Record | None, new: Record, flush_rename: bool = True) -> None:
        """A new record written; a changed one rewritten under its current name, then renamed when its status
        changed (a status change alone is only the rename): every step leaves exactly one complete file."""
        if old is None:
            write_atomic(folder / file_name(new), record_json(new))
            return
        if replace(old, status=new.status) != new:
            write_atomic(folder / file_name(old), record_json(new))
        if file_name(old) != file_name(new):
            os.replace(folder / file_name(old), folder / file_name(new))
            if flush_rename:
                fsync_dir(folder)

    def put_volume(self, rec: VolumeRecord, flush_renames: bool = True) -> VolumeRecord:
        self._apply(lambda s: Delta.of_record("volumes", s.volumes.get(rec.uuid), rec), flush_renames)
        return rec

    def drop_volume(self, vol_uuid: str) -> None:
        self._apply(lambda s: Delta.of_record("volumes", s.volumes.get(vol_uuid), None))

    def put_snapshot(self, rec: SnapshotRecord) -> SnapshotRecord:
        self._apply(lambda s: Delta.of_record("snapshots", s.snapshots.get(rec.uuid), rec))
        return rec

    def drop_snapshot(self, snap_uuid: str) -> None:
        self._apply(lambda s: Delta.of_record("snapshots", s.snapshots.get(snap_uuid), None))

    def put_ana(self, group: str, ana_state: str) -> None:
        self.commit(lambda s: s.with_ana(group, ana_state))
