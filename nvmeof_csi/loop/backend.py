"""DEVELOPMENT-ONLY backend: a volume is a sparse file, "connecting" attaches it with ``losetup``.

It exists so the whole CSI surface (controller and node, mount and block modes) runs on a machine without
NVMe-oF, with real mkfs, mount and bind mounts. It implements exactly the ``TargetBackend`` protocol of
``nvmeof_csi.service.contracts`` (its ``Connector`` is ``nvmeof_csi.loop.connector``); it gives no
durability, isolation or access control and must never be used for real data.

Layout under ``root``: ``<uuid>.img`` (sparse backing file) and ``<uuid>.json`` (name, capacity, parameters,
published nodes), the JSON written atomically *before* the image is created or changed.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvmeof_csi.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unimplemented,
)
from nvmeof_csi.host.atomic import read_json, remove_durably, write_json_atomic
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import (
    NO_SECRETS,
    Condition,
    ContentSource,
    Health,
    Snapshot,
    Topology,
    TopologyRequirement,
    Volume,
    VolumeRef,
)

LOCATION = "loop"
CTX_BACKEND = "backend"
CTX_PATH = "loop.path"
LOSETUP_TIMEOUT = 60.0


class LoopTargetBackend:
    """Sparse files in ``root`` as volumes, no snapshots or clones; thread-safe for different volumes."""

    supports_snapshots = False

    def __init__(self, root: Path, capacity_bytes: int, topology: Topology) -> None:
        self._root = root
        self._capacity = capacity_bytes
        self._topology = dict(topology)

    # -- records ---------------------------------------------------------------------------------------
    def _meta_path(self, vol_uuid: str) -> Path:
        return self._root / f"{vol_uuid}.json"

    def _image_path(self, vol_uuid: str) -> Path:
        return self._root / f"{vol_uuid}.img"

    def _load(self, vol_uuid: str) -> dict[str, Any] | None:
        try:
            uuid.UUID(vol_uuid)
        except ValueError:
            return None
        doc = read_json(self._meta_path(vol_uuid))
        return doc if isinstance(doc, dict) else None

    def _volume(self, vol_uuid: str, doc: Mapping[str, Any]) -> Volume:
        params = VolumeParameters.parse(doc.get("parameters", {}))  # as stored: parsed once, here
        return Volume(
            ref=VolumeRef(LOCATION, vol_uuid),
            name=str(doc["name"]),
            capacity_bytes=int(doc["capacity_bytes"]),
            parameters=params,
            context={
                CTX_BACKEND: LOCATION,
                CTX_PATH: str(self._image_path(vol_uuid)),
                **params.limits.to_context(),
            },
            accessible_topology=(dict(self._topology),) if self._topology else (),
            published_nodes=tuple(sorted(doc.get("published", {}))),
        )

    def _all(self) -> list[tuple[str, dict[str, Any]]]:
        if not self._root.is_dir():
            return []
        found = []
        for meta in sorted(self._root.glob("*.json")):
            doc = self._load(meta.stem)
            if doc is not None:
                found.append((meta.stem, doc))
        return found

    def _require(self, ref: VolumeRef) -> dict[str, Any]:
        doc = self._load(ref.uuid) if ref.location == LOCATION else None
        if doc is None:
            raise NotFound(f"volume {ref.uuid} does not exist")
        return doc

    # -- TargetBackend ---------------------------------------------------------------------------------
    def health(self) -> Health:
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return Health(False, f"loop backend folder {self._root} is not usable: {exc}")
        if not os.access(self._root, os.W_OK):
            return Health(False, f"loop backend folder {self._root} is not writable")
        return Health(True, "loop backend (development only)")

    def _provisioned(self) -> int:
        return sum(int(doc["capacity_bytes"]) for _, doc in self._all())

    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: VolumeParameters,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
        wait: float | None = None,
    ) -> Volume:
        existing = self.find_volume_by_name(name)
        if existing is not None:
            return existing
        if source is not None:
            raise InvalidArgument("the loop backend cannot fill a volume from a snapshot or volume")
        if parameters.auth != "none":
            raise FailedPrecondition("the loop backend has no in-band authentication (auth: none only)")
        if parameters.dataset is not None:
            raise FailedPrecondition(
                "the loop backend cannot fill dataset volumes (use the nvmeof backend with "
                "agents started with --alluxio-proxy)"
            )
        if (
            requirement
            and requirement.requisite
            and not any(
                all(self._topology.get(k) == v for k, v in t.items() if k in self._topology)
                for t in requirement.requisite
            )
        ):
            raise ResourceExhausted("no storage in the requested topology (requisite segments unreachable)")
        if self._provisioned() + capacity_bytes > self._capacity:
            raise ResourceExhausted(
                f"loop backend has {self._capacity - self._provisioned()} bytes left, {capacity_bytes} requested"
            )
        vol_uuid = str(uuid.uuid4())
        doc = {"name": name, "capacity_bytes": capacity_bytes, "parameters": parameters.to_map(), "published": {}}
        write_json_atomic(self._meta_path(vol_uuid), doc)
        with open(self._image_path(vol_uuid), "ab") as image:
            os.truncate(image.fileno(), capacity_bytes)
        return self._volume(vol_uuid, doc)

    def find_volume_by_name(
        self,
        name: str,
        parameters: VolumeParameters | None = None,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
    ) -> Volume | None:
        for vol_uuid, doc in self._all():
            if doc.get("name") == name:
                return self._volume(vol_uuid, doc)
        return None

    def get_volume(self, ref: VolumeRef) -> Volume | None:
        doc = self._load(ref.uuid) if ref.location == LOCATION else None
        return None if doc is None else self._volume(ref.uuid, doc)

    def list_volumes(self) -> list[Volume]:
        return [self._volume(vol_uuid, doc) for vol_uuid, doc in self._all()]

    def delete_volume(self, ref: VolumeRef) -> None:
        doc = self._load(ref.uuid) if ref.location == LOCATION else None
        if doc is None:
            return
        if doc.get("published"):
            raise FailedPrecondition(f"volume {ref.uuid} is still published to {sorted(doc['published'])}")
        self._image_path(ref.uuid).unlink(missing_ok=True)
        remove_durably(self._meta_path(ref.uuid))

    def modify_volume(self, ref: VolumeRef, changes: Mapping[str, str]) -> None:
        doc = self._require(ref)
        merged = VolumeParameters.parse(doc.get("parameters", {})).with_changes(changes).to_map()
        if merged != doc.get("parameters", {}):
            doc["parameters"] = merged
            write_json_atomic(self._meta_path(ref.uuid), doc)

    def expand_volume(self, ref: VolumeRef, capacity_bytes: int) -> int:
        doc = self._require(ref)
        current = int(doc["capacity_bytes"])
        if capacity_bytes <= current:
            return current
        if self._provisioned() - current + capacity_bytes > self._capacity:
            raise ResourceExhausted(f"loop backend cannot grow volume {ref.uuid} to {capacity_bytes} bytes")
        doc["capacity_bytes"] = capacity_bytes
        write_json_atomic(self._meta_path(ref.uuid), doc)
        os.truncate(self._image_path(ref.uuid), capacity_bytes)
        return capacity_bytes

    def publish(
        self,
        ref: VolumeRef,
        node_id: str,
        readonly: bool,
        secrets: Mapping[str, str] = NO_SECRETS,
        node_name: str = "",
    ) -> Mapping[str, str]:
        doc = self._require(ref)
        published = doc.setdefault("published", {})
        if node_id in published and published[node_id] != readonly:
            raise AlreadyExists(
                f"volume {ref.uuid} is already published to {node_id} with readonly={published[node_id]}"
            )
        if node_id not in published:
            published[node_id] = readonly
            write_json_atomic(self._meta_path(ref.uuid), doc)
        return {"loop.readonly": "true" if readonly else "false"}

    def unpublish(self, ref: VolumeRef, node_id: str) -> None:
        doc = self._load(ref.uuid) if ref.location == LOCATION else None
        if doc is None or node_id not in doc.get("published", {}):
            return
        del doc["published"][node_id]
        write_json_atomic(self._meta_path(ref.uuid), doc)

    def fence(self, ref: VolumeRef, node_id: str, reason: str, boot_id: str) -> None:
        """One node, which is this host, and no fabric: nothing to end but the grant."""
        self.unpublish(ref, node_id)

    def unfence(self, ref: VolumeRef, node_id: str) -> None:
        """Nothing is kept fenced (see :meth:`fence`)."""

    def available_capacity(self, segment: Topology | None, parameters: VolumeParameters | None = None) -> int:
        if segment and any(self._topology.get(k) != v for k, v in segment.items()):
            return 0
        free_disk = shutil.disk_usage(self._root).free if self._root.is_dir() else 0
        return max(0, min(self._capacity - self._provisioned(), free_disk))

    def max_volume_size(self) -> int:
        return self._capacity

    def condition(self, ref: VolumeRef) -> Condition:
        if self.get_volume(ref) is None:
            return Condition(True, "volume record is missing")
        if not self._image_path(ref.uuid).exists():
            return Condition(True, f"backing file {self._image_path(ref.uuid)} is missing")
        return Condition(False, "backing file present")

    def create_snapshot(self, name: str, source: VolumeRef) -> Snapshot:
        raise Unimplemented("the loop backend has no snapshots")

    def find_snapshot_by_name(self, name: str) -> Snapshot | None:
        return None

    def get_snapshot(self, ref: VolumeRef) -> Snapshot | None:
        return None

    def delete_snapshot(self, ref: VolumeRef) -> None:
        return None

    def list_snapshots(self) -> list[Snapshot]:
        return []
