"""The target agent's logic: volumes, snapshots, clones, host grants and ANA, over configfs and the pool.

Contract:
- Idempotent and keyed by name (creates) or UUID: repeating an operation returns the same result.
- Save before acting, in this order: create = record(creating) -> file -> configfs -> record(ready);
  delete = record(deleting) -> configfs -> file -> drop record. :meth:`TargetAgent.converge` (run at start)
  finishes whatever a crash interrupted, so state, configfs and pool always end up in agreement.
- Objects the state does not know (subsystems, ports, hosts, image files) are reported, and removed only
  when converging with ``prune``; interrupted temporary files are always ours and always removed.
- Concurrency: creates are serialised per name, everything else per volume/snapshot UUID; portal (port)
  changes under one lock. Many threads may call in at once.
- Errors: ``nvmeof_csi.errors`` classes (NotFound, AlreadyExists, ResourceExhausted, ...).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from nvmeof_csi.agent.configfs import ANA_STATES, Nvmet, PortSpec
from nvmeof_csi.agent.state import (
    CREATING,
    DELETING,
    READY,
    SnapshotRecord,
    StateStore,
    VolumeRecord,
)
from nvmeof_csi.agent.store import FileStore
from nvmeof_csi.cache.volumes import DatasetVolumes
from nvmeof_csi.errors import (
    AlreadyExists,
    DriverError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    Unavailable,
)
from nvmeof_csi.nvmeof.nqn import check_host_nqn, namespace_nguid, volume_nqn
from nvmeof_csi.rpc.locks import KeyedMutex

log = logging.getLogger(__name__)
NSID = 1
MODEL = "nvmeof-csi"


@dataclass(frozen=True)
class VolumeView:
    """A volume as the API shows it."""

    record: VolumeRecord
    nqn: str
    namespace_uuid: str
    namespace_nguid: str
    portals: Sequence[tuple[PortSpec, str]]  # (portal, ANA state)
    progress: str = ""  # dataset hydration in progress ("copying: 12/100 files, ...")


@dataclass
class ConvergeReport:
    applied: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class TargetAgent:
    def __init__(
        self,
        name: str,
        nvmet: Nvmet,
        store: FileStore,
        state: StateStore,
        portals: Sequence[PortSpec],
        capacity_limit: int = 0,
        buffered_io: bool = False,
        clock: Callable[[], float] = time.time,
        datasets: DatasetVolumes | None = None,
    ) -> None:
        ids = [p.port_id for p in portals]
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"portal IDs must be unique: {ids}")
        self.name = name
        self.nvmet = nvmet
        self.store = store
        self.state = state
        self.portals = list(portals)
        self.capacity_limit = capacity_limit
        self.buffered_io = buffered_io
        self._clock = clock
        self.datasets = datasets
        self._keys = KeyedMutex()
        self._ports = threading.Lock()

    # -- views -------------------------------------------------------------------------------------------
    def _view(self, rec: VolumeRecord) -> VolumeView:
        ana = self.state.current.ana
        return VolumeView(
            rec, volume_nqn(rec.uuid), rec.uuid, namespace_nguid(rec.uuid),
            [(p, ana.get(p.group, "optimized")) for p in self.portals],
            self.datasets.progress(rec.uuid) if self.datasets else "",
        )

    def _live_volumes(self) -> list[VolumeRecord]:
        return [v for v in self.state.current.volumes.values() if v.status != DELETING]

    def _volume(self, vol_uuid: str) -> VolumeRecord:
        rec = self.state.current.volumes.get(vol_uuid)
        if rec is None or rec.status == DELETING:
            raise NotFound(f"volume {vol_uuid} does not exist on agent {self.name}")
        return rec

    def get_volume(self, vol_uuid: str = "", name: str = "") -> VolumeView:
        if name:
            for rec in self._live_volumes():
                if rec.name == name:
                    return self._view(rec)
            raise NotFound(f"no volume named {name!r} on agent {self.name}")
        return self._view(self._volume(vol_uuid))

    def list_volumes(self) -> list[VolumeView]:
        return [self._view(v) for v in sorted(self._live_volumes(), key=lambda v: v.uuid)]

    def provisioned_bytes(self) -> int:
        return sum(v.capacity_bytes for v in self.state.current.volumes.values())

    def capacity_bytes(self) -> int:
        return self.capacity_limit or self.store.usage().total_bytes

    # -- volumes -------------------------------------------------------------------------------------------
    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: Mapping[str, str],
        labels: Mapping[str, str],
        source_volume: str = "",
        source_snapshot: str = "",
    ) -> VolumeView:
        if not name:
            raise InvalidArgument("volume name is required")
        if capacity_bytes <= 0:
            raise InvalidArgument("capacity_bytes must be positive")
        with self._keys.hold(f"name:{name}"):
            for found in self._live_volumes():
                if found.name == name:
                    self._check_same(found, capacity_bytes, parameters, source_volume, source_snapshot)
                    if found.status == CREATING:
                        with self._keys.hold(found.uuid):
                            found = self._finish_creating(found)  # noqa: PLW2901 - returned right away
                    return self._view(found)
            source_size = self._source_size(source_volume, source_snapshot)
            if capacity_bytes < source_size:
                raise OutOfRange(f"capacity {capacity_bytes} is smaller than the source's {source_size} bytes")
            self.store.check_space(capacity_bytes, self.provisioned_bytes(), self.capacity_bytes())
            rec = VolumeRecord(
                uuid=str(uuidlib.uuid4()), name=name, capacity_bytes=capacity_bytes, parameters=dict(parameters),
                labels=dict(labels), source_volume=source_volume, source_snapshot=source_snapshot,
                status=CREATING,
            )
            self._dataset(rec)  # refuse a dataset volume early when this agent has no cache
            with self._keys.hold(rec.uuid):
                rec = self._first_save(rec)
                rec = self._materialize_new(rec)
            log.info("volume %s (%s) created: %d bytes", rec.uuid, name, capacity_bytes)
            return self._view(rec)

    def _first_save(self, rec: VolumeRecord) -> VolumeRecord:
        """Save before acting. The creation time is taken inside the state lock, at the moment the record
        becomes visible, so a name lookup that did not see it is always older than its timestamp (racing
        controllers compare these times to agree on one copy)."""
        state = self.state.commit(lambda s: s.with_volume(rec.evolve(created_at=self._clock())))
        return state.volumes[rec.uuid]

    @staticmethod
    def _check_same(
        rec: VolumeRecord, capacity: int, params: Mapping[str, str], src_vol: str, src_snap: str
    ) -> None:
        if rec.capacity_bytes != capacity or dict(rec.parameters) != dict(params):
            raise AlreadyExists(f"volume {rec.name!r} exists with other capacity or parameters")
        if (rec.source_volume, rec.source_snapshot) != (src_vol, src_snap):
            raise AlreadyExists(f"volume {rec.name!r} exists with another content source")

    def _source_size(self, source_volume: str, source_snapshot: str) -> int:
        if source_volume and source_snapshot:
            raise InvalidArgument("a volume has at most one content source")
        if source_volume:
            return self._volume(source_volume).capacity_bytes
        if source_snapshot:
            snap = self.state.current.snapshots.get(source_snapshot)
            if snap is None or snap.status != READY:
                raise NotFound(f"snapshot {source_snapshot} does not exist on agent {self.name}")
            return snap.size_bytes
        return 0

    def _finish_creating(self, seen: VolumeRecord) -> VolumeRecord:
        """Finish a create someone else may have been finishing meanwhile (re-read under the volume's key)."""
        current = self.state.current.volumes.get(seen.uuid)
        if current is None or current.status == DELETING:
            raise Unavailable(f"volume {seen.name!r} could not be created (its hydration failed); retry")
        return self._materialize_new(current) if current.status == CREATING else current

    def _dataset(self, rec: VolumeRecord) -> DatasetVolumes | None:
        """The dataset hydration service when ``rec`` is a dataset volume (FAILED_PRECONDITION without one)."""
        if DatasetVolumes.spec(rec.parameters) is None:
            return None
        if self.datasets is None:
            raise FailedPrecondition(f"agent {self.name} has no Alluxio configured (--alluxio-proxy): "
                                     "it cannot create dataset volumes")
        return self.datasets

    def _materialize_new(self, rec: VolumeRecord) -> VolumeRecord:
        """:meth:`_materialize` for a create; a dataset volume whose hydration fails is removed again (nothing
        half-created is left: record, configfs objects, backing file and work folder all go)."""
        try:
            return self._materialize(rec)
        except DriverError:
            if self._dataset(rec) is not None:
                log.warning("volume %s (%s): hydration failed; removing the volume", rec.uuid, rec.name)
                self._teardown(self.state.put_volume(rec.evolve(status=DELETING)))
                self._discard_work(rec)
            raise

    def _discard_work(self, rec: VolumeRecord) -> None:
        if self.datasets is not None:
            self.datasets.discard(rec.uuid)

    def _hydrate(self, rec: VolumeRecord, path: Path) -> VolumeRecord:
        datasets = self._dataset(rec)
        spec = DatasetVolumes.spec(rec.parameters)
        if datasets is None or spec is None or rec.status == READY:
            return rec
        labels = datasets.fill(rec.uuid, spec, path, rec.capacity_bytes)
        return self.state.put_volume(rec.evolve(labels={**rec.labels, **labels}))

    def _materialize(self, rec: VolumeRecord) -> VolumeRecord:
        """Make file and configfs match ``rec`` (creating -> ready). Caller holds the volume's key."""
        path = self.store.volume_path(rec.uuid)
        if not path.exists():
            if rec.status == READY:
                raise FailedPrecondition(f"backing file of ready volume {rec.uuid} is missing; refusing to recreate")
            if rec.source_snapshot:
                self.store.clone(self.store.snapshot_path(rec.source_snapshot), path, rec.capacity_bytes)
            elif rec.source_volume:
                self.store.clone(self.store.volume_path(rec.source_volume), path, rec.capacity_bytes)
            else:
                self.store.create(path, rec.capacity_bytes)
        else:
            self.store.grow(path, rec.capacity_bytes)
        rec = self._hydrate(rec, path)  # dataset volumes: filled before the namespace is exported
        nqn = volume_nqn(rec.uuid)
        self.nvmet.ensure_subsystem(nqn, serial=rec.uuid.replace("-", "")[:20], model=MODEL)
        self.nvmet.ensure_namespace(nqn, NSID, str(path), rec.uuid, namespace_nguid(rec.uuid), self.buffered_io)
        for host_nqn, secret in rec.hosts.items():
            self.nvmet.ensure_host(host_nqn, secret)
            self.nvmet.allow(nqn, host_nqn)
        for host_nqn in set(self.nvmet.allowed_hosts(nqn)) - set(rec.hosts):
            self.nvmet.deny(nqn, host_nqn)
        for portal in self.portals:
            self.nvmet.link(portal.port_id, nqn)
        if rec.status != READY:
            rec = self.state.put_volume(rec.evolve(status=READY))
            self._discard_work(rec)
        return rec

    def delete_volume(self, vol_uuid: str) -> None:
        with self._keys.hold(vol_uuid):
            rec = self.state.current.volumes.get(vol_uuid)
            if rec is None:
                return
            if rec.status != DELETING:
                rec = self.state.put_volume(rec.evolve(status=DELETING))  # save before acting
            self._teardown(rec)
            self._discard_work(rec)
            self._release_dataset(rec)
        log.info("volume %s (%s) deleted", vol_uuid, rec.name)

    def _release_dataset(self, rec: VolumeRecord) -> None:
        spec = DatasetVolumes.spec(rec.parameters)
        if spec is not None and self.datasets is not None:
            self.datasets.release_if_unused(spec, [v.parameters for v in self._live_volumes() if v.uuid != rec.uuid])

    def _teardown(self, rec: VolumeRecord) -> None:
        nqn = volume_nqn(rec.uuid)
        if nqn in self.nvmet.subsystems():
            self.nvmet.remove_subsystem(nqn)
        for host_nqn in rec.hosts:
            self.nvmet.remove_host(host_nqn)
        self.store.delete(self.store.volume_path(rec.uuid))
        self.state.drop_volume(rec.uuid)

    def resize_volume(self, vol_uuid: str, capacity_bytes: int) -> VolumeView:
        with self._keys.hold(vol_uuid):
            rec = self._volume(vol_uuid)
            if capacity_bytes > rec.capacity_bytes:
                grow_by = capacity_bytes - rec.capacity_bytes
                self.store.check_space(grow_by, self.provisioned_bytes(), self.capacity_bytes())
                rec = self.state.put_volume(rec.evolve(capacity_bytes=capacity_bytes))
                self.store.grow(self.store.volume_path(vol_uuid), capacity_bytes)
                self.nvmet.revalidate(volume_nqn(vol_uuid), NSID)
            return self._view(rec)

    # -- hosts ---------------------------------------------------------------------------------------------
    def allow_host(self, vol_uuid: str, host_nqn: str, secret: str = "", readonly: bool = False) -> VolumeView:
        check_host_nqn(host_nqn)
        with self._keys.hold(vol_uuid):
            rec = self._volume(vol_uuid)
            if host_nqn in rec.hosts and (host_nqn in rec.readonly_hosts) != readonly:
                raise AlreadyExists(
                    f"host {host_nqn} is already allowed on volume {vol_uuid} with readonly={not readonly}"
                )
            self.nvmet.ensure_host(host_nqn, secret)  # fails early if a secret cannot be honoured
            if rec.hosts.get(host_nqn) != secret or host_nqn not in rec.hosts:
                ro = tuple(sorted({*rec.readonly_hosts, host_nqn})) if readonly else rec.readonly_hosts
                rec = self.state.put_volume(rec.evolve(hosts={**rec.hosts, host_nqn: secret}, readonly_hosts=ro))
            self.nvmet.allow(volume_nqn(vol_uuid), host_nqn)
            return self._view(rec)

    def deny_host(self, vol_uuid: str, host_nqn: str) -> VolumeView:
        with self._keys.hold(vol_uuid):
            rec = self._volume(vol_uuid)
            if host_nqn in rec.hosts:
                rec = self.state.put_volume(rec.evolve(
                    hosts={k: v for k, v in rec.hosts.items() if k != host_nqn},
                    readonly_hosts=tuple(h for h in rec.readonly_hosts if h != host_nqn),
                ))
            self.nvmet.deny(volume_nqn(vol_uuid), host_nqn)
            self.nvmet.remove_host(host_nqn)
            return self._view(rec)

    # -- snapshots -----------------------------------------------------------------------------------------
    def create_snapshot(self, name: str, source_volume: str) -> SnapshotRecord:
        if not name:
            raise InvalidArgument("snapshot name is required")
        with self._keys.hold(f"snap-name:{name}"):
            for found in self.state.current.snapshots.values():
                if found.name == name and found.status != DELETING:
                    if found.source_volume != source_volume:
                        raise AlreadyExists(f"snapshot {name!r} exists for another volume")
                    if found.status != CREATING:
                        return found
                    with self._keys.hold(found.uuid):
                        return self._take_snapshot(found)
            with self._keys.hold(source_volume):
                vol = self._volume(source_volume)
                snap = SnapshotRecord(
                    uuid=str(uuidlib.uuid4()), name=name, source_volume=source_volume,
                    size_bytes=vol.capacity_bytes, status=CREATING, created_at=self._clock(),
                )
                with self._keys.hold(snap.uuid):
                    self.state.put_snapshot(snap)
                    return self._take_snapshot(snap)

    def _take_snapshot(self, snap: SnapshotRecord) -> SnapshotRecord:
        source, target = self.store.volume_path(snap.source_volume), self.store.snapshot_path(snap.uuid)
        self.store.clone(source, target, snap.size_bytes)
        return self.state.put_snapshot(snap.evolve(status=READY))

    def delete_snapshot(self, snap_uuid: str) -> None:
        with self._keys.hold(snap_uuid):
            snap = self.state.current.snapshots.get(snap_uuid)
            if snap is None:
                return
            self._remove_snapshot(snap)

    def _remove_snapshot(self, snap: SnapshotRecord) -> None:
        """Tombstone, delete the file, drop the record. Caller holds the snapshot's key."""
        if snap.status != DELETING:
            self.state.put_snapshot(snap.evolve(status=DELETING))  # save before acting
        self.store.delete(self.store.snapshot_path(snap.uuid))
        self.state.drop_snapshot(snap.uuid)

    def list_snapshots(self, source_volume: str = "", snapshot_uuid: str = "") -> list[SnapshotRecord]:
        snaps = [s for s in self.state.current.snapshots.values() if s.status == READY]
        if source_volume:
            snaps = [s for s in snaps if s.source_volume == source_volume]
        if snapshot_uuid:
            snaps = [s for s in snaps if s.uuid == snapshot_uuid]
        return sorted(snaps, key=lambda s: s.uuid)

    # -- portals and ANA -------------------------------------------------------------------------------------
    def list_portals(self) -> list[tuple[PortSpec, str]]:
        return [(p, self.nvmet.ana_state(p.port_id)) for p in self.portals]

    def set_ana(self, group: str, ana_state: str) -> list[tuple[PortSpec, str]]:
        if ana_state not in ANA_STATES:
            raise InvalidArgument(f"ANA state {ana_state!r} must be one of {', '.join(ANA_STATES)}")
        members = [p for p in self.portals if p.group == group]
        if not members:
            groups = sorted({p.group for p in self.portals})
            raise NotFound(f"no portal group {group!r} on agent {self.name} (groups: {', '.join(groups)})")
        with self._ports:
            self.state.put_ana(group, ana_state)
            for portal in members:
                self.nvmet.set_ana(portal.port_id, ana_state)
        return self.list_portals()

    # -- convergence -------------------------------------------------------------------------------------
    def converge(self, prune: bool = False) -> ConvergeReport:
        """Make configfs and the pool match the saved state; see the module docstring."""
        report = ConvergeReport()
        self.store.prepare()
        for tmp in self.store.sweep_temp():
            report.applied.append(f"removed interrupted file {tmp.name}")
        self._converge_ports(report)
        self._converge_snapshots(report)
        self._converge_volumes(report)
        self._unknown(report, prune)
        log.info("converged: %d applied, %d unknown, %d pruned, %d problems",
                 len(report.applied), len(report.unknown), len(report.pruned), len(report.problems))
        return report

    def _converge_ports(self, report: ConvergeReport) -> None:
        with self._ports:
            for portal in self.portals:
                self.nvmet.ensure_port(portal)
                state = self.state.current.ana.get(portal.group, "optimized")
                if self.nvmet.set_ana(portal.port_id, state):
                    report.applied.append(f"port {portal.port_id}: ANA {state}")

    def _converge_snapshots(self, report: ConvergeReport) -> None:
        for snap in list(self.state.current.snapshots.values()):
            with self._keys.hold(snap.uuid):
                if snap.status == DELETING:
                    self._remove_snapshot(snap)
                    report.applied.append(f"finished deleting snapshot {snap.uuid}")
                elif snap.status == CREATING:
                    if snap.source_volume in self.state.current.volumes:
                        self._take_snapshot(snap)
                        report.applied.append(f"finished snapshot {snap.uuid}")
                    else:
                        self.state.drop_snapshot(snap.uuid)
                        report.applied.append(f"dropped snapshot {snap.uuid} whose source is gone")

    def _converge_volumes(self, report: ConvergeReport) -> None:
        for rec in list(self.state.current.volumes.values()):
            with self._keys.hold(rec.uuid):
                if rec.status == DELETING:
                    self._teardown(rec)
                    report.applied.append(f"finished deleting volume {rec.uuid}")
                    continue
                if rec.status == CREATING and DatasetVolumes.spec(rec.parameters) is not None:
                    report.applied.append(f"volume {rec.uuid}: dataset hydration resumes in the background")
                    continue  # can take minutes: resume_hydrations() runs it once the agent serves
                try:
                    before = rec.status
                    self._materialize(rec)
                    if before == CREATING:
                        report.applied.append(f"finished creating volume {rec.uuid}")
                except DriverError as err:
                    report.problems.append(f"volume {rec.uuid}: {err}")

    def resume_hydrations(self) -> None:
        """Finish dataset volumes a restart interrupted (their journals make this resume, not restart); a
        hydration that fails now removes its volume, as a failed create does. Run after the agent serves."""
        for rec in list(self.state.current.volumes.values()):
            if rec.status != CREATING or DatasetVolumes.spec(rec.parameters) is None:
                continue
            with self._keys.hold(f"name:{rec.name}"), self._keys.hold(rec.uuid):
                current = self.state.current.volumes.get(rec.uuid)
                if current is None or current.status != CREATING:
                    continue
                try:
                    self._materialize_new(current)
                    log.info("volume %s (%s): resumed hydration finished", rec.uuid, rec.name)
                except DriverError as err:
                    log.warning("volume %s (%s): resumed hydration failed, volume removed: %s", rec.uuid, rec.name, err)

    def _unknown(self, report: ConvergeReport, prune: bool) -> None:
        state = self.state.current
        known_nqns = {volume_nqn(u) for u in state.volumes}
        for nqn in self.nvmet.subsystems():
            if nqn not in known_nqns:
                self._report_unknown(report, prune, f"subsystem {nqn}", partial(self.nvmet.remove_subsystem, nqn))
        known_ports = {p.port_id for p in self.portals}
        for port_id in self.nvmet.ports():
            if port_id not in known_ports:
                self._report_unknown(report, prune, f"port {port_id}", partial(self.nvmet.remove_port, port_id))
        known_hosts = {h for v in state.volumes.values() for h in v.hosts}
        for host in self.nvmet.hosts():
            if host not in known_hosts:
                self._report_unknown(report, prune, f"host {host}", partial(self.nvmet.remove_host, host))
        known_files = {self.store.volume_path(u) for u in state.volumes} | {
            self.store.snapshot_path(u) for u in state.snapshots
        }
        for path in self.store.files():
            if path not in known_files:
                self._report_unknown(report, prune, f"file {path}", partial(self.store.delete, path))

    @staticmethod
    def _report_unknown(report: ConvergeReport, prune: bool, what: str, remove: Callable[[], None]) -> None:
        if prune:
            remove()
            report.pruned.append(what)
        else:
            report.unknown.append(what)
