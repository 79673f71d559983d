"""The agent's state as data: the records (volumes, snapshots), the whole state (immutable; changes make new
states), how a record is named and written on disk, and what one commit changed (:class:`Delta`). Stored by
``agent/state.py``.

Contract: records and states are immutable; :meth:`Delta.between` diffs two states (walks them),
:meth:`Delta.of_record` describes one record's change (costs that record); :meth:`Delta.onto` applies a change to a
state that other commits may have changed meanwhile (their records kept).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, TypedDict

from immutables import Map

from nvmeof_csi.errors import DriverError
from nvmeof_csi.nvmeof.parameters import VolumeParameters

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
    tls_keys: Mapping[str, str] = field(default_factory=dict)  # host NQN -> NVMe/TCP TLS PSK (``tls: psk`` volumes)
    host_nodes: Mapping[str, str] = field(default_factory=dict)  # host NQN -> its Kubernetes Node (from the grant)
    replica: Mapping[str, str] = field(default_factory=dict)  # its pair (``agent/replica_spec.py``); {}: one copy

    def evolve(self, **changes: Any) -> VolumeRecord:
        return replace(self, **changes)

    @cached_property
    def options(self) -> VolumeParameters:
        """The stored parameters, typed (parsed once per record: they were validated when it was made)."""
        return VolumeParameters.parse(self.parameters)

    def without_host(self, host_nqn: str) -> VolumeRecord:
        """The record with ``host_nqn``'s grant gone: its keys and its read-only mark too."""
        return replace(
            self,
            hosts={k: v for k, v in self.hosts.items() if k != host_nqn},
            ctrl_keys={k: v for k, v in self.ctrl_keys.items() if k != host_nqn},
            tls_keys={k: v for k, v in self.tls_keys.items() if k != host_nqn},
            host_nodes={k: v for k, v in self.host_nodes.items() if k != host_nqn},
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


def volume_from(doc: Mapping[str, Any]) -> VolumeRecord:
    return VolumeRecord(**{**doc, "readonly_hosts": tuple(doc.get("readonly_hosts", ()))})


def snapshot_from(doc: Mapping[str, Any]) -> SnapshotRecord:
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
        """``state`` with this change applied (other records, changed meanwhile by other commits, kept). Costs
        the change, not the state: the records are an immutable map (a hash array mapped trie), so the new state
        shares every record it does not change with the old one, which its readers may still hold."""
        merged: dict[str, Mapping[str, Any]] = {}
        for kind in KINDS:
            if not self.put[kind] and not self.gone[kind]:
                merged[kind] = getattr(state, kind)  # unchanged: shared, not copied
                continue
            records = getattr(state, kind)
            with (records if isinstance(records, Map) else Map(records)).mutate() as edit:
                for k, (_, new) in self.put[kind].items():
                    edit[k] = new
                for k in self.gone[kind]:
                    edit.pop(k, None)
                merged[kind] = edit.finish()
        return AgentState(
            volumes=merged["volumes"], snapshots=merged["snapshots"], ana=state.ana if self.ana is None else self.ana
        )

    def changed(self) -> list[tuple[str, str]]:
        """The (kind, UUID) pairs this change puts or removes."""
        return [(k, u) for k in KINDS for part in (self.put, self.gone) for u in part[k]]
