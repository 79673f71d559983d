"""Snapshots on the agents, as the controller's backend sees them: a snapshot lives on its source volume's agent;
listings go over every agent of the fabric map (an unreachable agent makes them ``UNAVAILABLE``, never shorter).
"""

from __future__ import annotations

from nvmeof_csi.agentclient.msgs import snapshot_of
from nvmeof_csi.fleet.agents import AgentFleet
from nvmeof_csi.service.contracts import Snapshot, VolumeRef


class AgentSnapshots(AgentFleet):
    def create_snapshot(self, name: str, source: VolumeRef) -> Snapshot:
        entry = self._require(source)
        made = self._client(entry).create_snapshot(name, source.uuid)
        self.capacity_seen.forget(entry.name)  # a snapshot takes pool space (a copy of the source's blocks)
        return snapshot_of(entry, made)

    def find_snapshot_by_name(self, name: str) -> Snapshot | None:
        return next((s for s in self.list_snapshots() if s.name == name), None)

    def get_snapshot(self, ref: VolumeRef) -> Snapshot | None:
        entry = self._entry(ref.location)
        if entry is None:
            return None
        snaps = self._client(entry).list_snapshots(snapshot_uuid=ref.uuid)
        return snapshot_of(entry, snaps[0]) if snaps else None

    def delete_snapshot(self, ref: VolumeRef) -> None:
        entry = self._entry(ref.location)
        if entry is not None:
            self._client(entry).delete_snapshot(ref.uuid)
            self.capacity_seen.forget(entry.name)

    def list_snapshots(self) -> list[Snapshot]:
        snaps = [snapshot_of(e, s) for e in self.fabric.agents for s in self._client(e).list_snapshots()]
        return sorted(snaps, key=lambda s: s.ref.uuid)
