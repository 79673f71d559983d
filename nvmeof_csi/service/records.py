"""Staging records: one JSON file per staged volume on the node, written atomically before the kernel is
touched, so Unstage and restart reconciliation never depend on memory.

Contract: :meth:`StagingStore.save` is durable when it returns; :meth:`StagingStore.load` returns ``None`` for
an absent record. A record that cannot be parsed is quarantined: renamed to ``<name>.corrupt-<unix time>``
and logged as an error naming it (never silently ignored), then treated as absent, so one bad file can
neither stop the node plugin from starting nor fail every later unstage. (Start-up reconciliation then keeps
the volume's device if it is still mounted or open.) A record that parses but that the connector cannot use is
set aside the same way by :meth:`StagingStore.quarantine`; :meth:`StagingStore.quarantined` lists what was set
aside (NodeGetStorageHealth reports it) until an operator removes the files.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nvmeof_csi.host.atomic import fsync_dir, read_json, remove_durably, write_json_atomic
from nvmeof_csi.host.filesystems import Usage
from nvmeof_csi.service.contracts import Condition, VolumeRef

log = logging.getLogger(__name__)
SUPPORTED_FS = ("ext4", "xfs")
#: The smallest device each filesystem can be made on (xfsprogs >= 5.19 refuses XFS below 300 MiB).
MIN_FS_BYTES = {"ext4": 0, "xfs": 300 << 20}


@dataclass(frozen=True)
class AccessSpec:
    """How the volume is consumed: a block device, or a filesystem with type and mount flags."""

    block: bool
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()
    readonly: bool = False  # a *_READER_ONLY access mode or a read-only attachment: never written on this node
    single_target: bool = False  # SINGLE_NODE_SINGLE_WRITER: published at one target path at most


@dataclass(frozen=True)
class VolumeStats:
    """Usage of a published or staged volume; ``usage`` is ``None`` for block volumes."""

    block: bool
    capacity_bytes: int
    usage: Usage | None
    condition: Condition


#: mounted read-only without replaying the journal: a read-only mount must not write either (ext4 and XFS replay
#: their journal on a plain ``ro`` mount, which corrupts a volume other nodes have mounted too)
NO_REPLAY = {"ext4": "noload", "xfs": "norecovery"}


def mount_options(access: AccessSpec, fs_type: str) -> tuple[str, ...]:
    """The staging mount's options: the capability's flags, and for a read-only volume ``ro`` + no journal replay."""
    flags = tuple(f for f in access.mount_flags if not access.readonly or f != "rw")
    if not access.readonly:
        return flags
    return (*flags, "ro", NO_REPLAY.get(fs_type, "ro"))


@dataclass(frozen=True)
class StagingRecord:
    volume_id: str
    ref: VolumeRef
    staging_path: str
    access: AccessSpec
    context: Mapping[str, str]
    device: str = ""
    targets: Mapping[str, bool] = field(default_factory=dict)  # target path -> readonly
    pods: Mapping[str, str] = field(default_factory=dict)  # target path -> UID of the pod it was published for

    def with_device(self, device: str) -> StagingRecord:
        return replace(self, device=device)

    def with_target(self, target: str, readonly: bool, pod_uid: str = "") -> StagingRecord:
        pods = {**self.pods, target: pod_uid} if pod_uid else {k: v for k, v in self.pods.items() if k != target}
        return replace(self, targets={**self.targets, target: readonly}, pods=pods)

    def without_target(self, target: str) -> StagingRecord:
        return replace(
            self,
            targets={k: v for k, v in self.targets.items() if k != target},
            pods={k: v for k, v in self.pods.items() if k != target},
        )

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["access"]["mount_flags"] = list(self.access.mount_flags)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StagingRecord:
        access = doc["access"]
        return cls(
            volume_id=str(doc["volume_id"]),
            ref=VolumeRef(str(doc["ref"]["location"]), str(doc["ref"]["uuid"])),
            staging_path=str(doc["staging_path"]),
            access=AccessSpec(
                bool(access["block"]),
                str(access["fs_type"]),
                tuple(access["mount_flags"]),
                bool(access.get("readonly", False)),
                bool(access.get("single_target", False)),
            ),
            context={str(k): str(v) for k, v in doc["context"].items()},
            device=str(doc.get("device", "")),
            targets={str(k): bool(v) for k, v in doc.get("targets", {}).items()},
            pods={str(k): str(v) for k, v in doc.get("pods", {}).items()},
        )


class StagingStore:
    """Records under ``root`` (``<uuid>.json``)."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self._root = root
        self._clock = clock

    def _path(self, ref: VolumeRef) -> Path:
        return self._root / f"{ref.location}.{ref.uuid}.json"

    def _read(self, path: Path) -> StagingRecord | None:
        try:
            doc = read_json(path)
            return None if doc is None else StagingRecord.from_json(doc)
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            self._quarantine(path, exc)
            return None

    def quarantine(self, ref: VolumeRef, exc: Exception) -> None:
        """Set ``ref``'s record aside (renamed, logged): it parses but cannot be used (e.g. its context)."""
        self._quarantine(self._path(ref), exc)

    def is_quarantined(self, ref: VolumeRef) -> bool:
        """Whether ``ref``'s record was set aside (and not yet removed by an operator)."""
        return any(self._root.glob(f"{self._path(ref).name}.corrupt-*")) if self._root.is_dir() else False

    def quarantined(self) -> list[str]:
        """The file names of records set aside, until an operator removes them."""
        return sorted(p.name for p in self._root.glob("*.json.corrupt-*")) if self._root.is_dir() else []

    def _quarantine(self, path: Path, exc: Exception) -> None:
        aside = path.with_name(f"{path.name}.corrupt-{int(self._clock())}")
        try:
            os.replace(path, aside)
            fsync_dir(path.parent)
        except FileNotFoundError:
            return
        log.error("staging record %s is unreadable (%r); quarantined as %s", path, exc, aside.name)

    def load(self, ref: VolumeRef) -> StagingRecord | None:
        return self._read(self._path(ref))

    def save(self, record: StagingRecord) -> None:
        write_json_atomic(self._path(record.ref), record.to_json())

    def remove(self, ref: VolumeRef) -> None:
        remove_durably(self._path(ref))

    def all(self) -> list[StagingRecord]:
        if not self._root.is_dir():
            return []
        records = (self._read(path) for path in sorted(self._root.glob("*.json")))
        return [r for r in records if r is not None]

    def refs(self) -> frozenset[VolumeRef]:
        """The volume of every record, from the file names alone (no record is read or checked: an unreadable
        record counts, which keeps a connection it may share rather than drop it under a volume)."""
        if not self._root.is_dir():
            return frozenset()
        names = (e.name[: -len(".json")] for e in os.scandir(self._root) if e.name.endswith(".json"))
        return frozenset(VolumeRef(loc, vol) for loc, dot, vol in (n.rpartition(".") for n in names) if dot)
