"""Snapshots on the target agent: reflink copies of a volume's backing file (instant on XFS with reflink).

Contract: idempotent by name (the same name for another source volume raises ``AlreadyExists``); save before
acting (record(creating) -> file -> record(ready); delete = record(deleting) -> file -> drop record), so
convergence finishes what a crash interrupted. Serialised per snapshot name and UUID, and with the source
volume's key while it is copied. A replicated volume is copied only while this replica holds every
acknowledged write (``replica_ops.check_copy_source``: refused, with nothing saved, otherwise).
"""

from __future__ import annotations

import uuid as uuidlib

from nvmeof_csi.agent.parts import AgentParts
from nvmeof_csi.agent.replica_ops import check_copy_source
from nvmeof_csi.agent.state import CREATING, DELETING, READY, SnapshotRecord
from nvmeof_csi.errors import AlreadyExists, InvalidArgument


class SnapshotOps:
    def __init__(self, parts: AgentParts) -> None:
        self._p = parts

    def create_snapshot(self, name: str, source_volume: str) -> SnapshotRecord:
        p = self._p
        if not name:
            raise InvalidArgument("snapshot name is required")
        with p.keys.hold(f"snap-name:{name}"):
            for found in p.state.current.snapshots.values():
                if found.name == name and found.status != DELETING:
                    if found.source_volume != source_volume:
                        raise AlreadyExists(f"snapshot {name!r} exists for another volume")
                    if found.status != CREATING:
                        return found
                    check_copy_source(p, p.volume(source_volume))
                    with p.keys.hold(found.uuid):
                        return self.take_snapshot(found)
            with p.keys.hold(source_volume):
                vol = p.volume(source_volume)
                check_copy_source(p, vol)  # before anything is saved: a refusal leaves nothing behind
                snap = SnapshotRecord(
                    uuid=str(uuidlib.uuid4()),
                    name=name,
                    source_volume=source_volume,
                    size_bytes=vol.capacity_bytes,
                    status=CREATING,
                    created_at=p.clock(),
                )
                with p.keys.hold(snap.uuid):
                    with p.reserving(vol.capacity_bytes):
                        p.state.put_snapshot(snap)
                    return self.take_snapshot(snap)

    def take_snapshot(self, snap: SnapshotRecord) -> SnapshotRecord:
        """Copy the source's file and mark the snapshot ready. Caller holds the snapshot's key."""
        p = self._p
        p.store.clone(p.store.volume_path(snap.source_volume), p.store.snapshot_path(snap.uuid), snap.size_bytes)
        return p.state.put_snapshot(snap.evolve(status=READY))

    def delete_snapshot(self, snap_uuid: str) -> None:
        with self._p.keys.hold(snap_uuid):
            snap = self._p.state.current.snapshots.get(snap_uuid)
            if snap is not None:
                self.remove_snapshot(snap)

    def remove_snapshot(self, snap: SnapshotRecord) -> None:
        """Tombstone, delete the file, drop the record. Caller holds the snapshot's key."""
        p = self._p
        if snap.status != DELETING:
            p.state.put_snapshot(snap.evolve(status=DELETING))  # save before acting
        p.store.delete(p.store.snapshot_path(snap.uuid))
        p.state.drop_snapshot(snap.uuid)

    def list_snapshots(self, source_volume: str = "", snapshot_uuid: str = "") -> list[SnapshotRecord]:
        snaps = [s for s in self._p.state.current.snapshots.values() if s.status == READY]
        if source_volume:
            snaps = [s for s in snaps if s.source_volume == source_volume]
        if snapshot_uuid:
            snaps = [s for s in snaps if s.uuid == snapshot_uuid]
        return sorted(snaps, key=lambda s: s.uuid)
