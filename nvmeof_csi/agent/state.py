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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from immutables import Map

from nvmeof_csi.agent.state_index import StateIndex
from nvmeof_csi.agent.state_model import (
    CREATING,
    DELETING,
    FORMAT_VERSION,
    KINDS,
    READY,
    AgentState,
    Delta,
    FenceMark,
    Record,
    SnapshotRecord,
    VolumeRecord,
    file_name,
    record_json,
    snapshot_from,
    volume_from,
)
from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.atomic import fsync_dir, read_json, remove_durably, write_atomic

__all__ = [  # the data model lives in ``agent/state_model.py``; importers of this module get it from here too
    "CREATING", "DELETING", "READY", "AgentState", "FenceMark", "SnapshotRecord", "StateStore", "VolumeRecord",
    "record_json",
]  # fmt: skip
LEGACY_DOCUMENT = "agent-state.json"
OLD_FLOOR_FILE = "time-floor.json"  # written by agents before name reservations


class StateStore:
    """The state in ``folder`` (see the module's layout), with an in-memory copy."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()  # guards the in-memory copy only, never held across file work
        for kind in KINDS:
            (folder / kind).mkdir(parents=True, exist_ok=True)
        self._migrate()
        self._state = self._load()
        self._index = StateIndex(self._state)

    def _load(self) -> AgentState:
        parsed: dict[str, dict[str, Any]] = {}
        for kind, build in (("volumes", volume_from), ("snapshots", snapshot_from)):
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
        return AgentState(volumes=Map(parsed["volumes"]), snapshots=Map(parsed["snapshots"]), ana=dict(ana))

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
            before, self._state = self._state, delta.onto(self._state)
            self._index.apply(before, self._state, delta.changed())
            return self._state

    def provisioned_bytes(self) -> int:
        """Every volume's size and every snapshot's (any status), of the current state."""
        with self._lock:
            return self._index.provisioned

    def named_volumes(self, name: str) -> list[VolumeRecord]:
        """The volumes (any status) called ``name`` in the current state; costs the name, not the state."""
        with self._lock:
            return self._index.named(self._state, name)

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
