"""Volumes on the target agent: create (also from a snapshot or a volume, also filled), delete, resize.

Contract:
- Idempotent and keyed by name (creates) or UUID: repeating an operation returns the same result; the same
  name with another size, parameters, source or reserved UUID raises ``AlreadyExists``. A create may bring the
  UUID its name's reservation holds (``agent/names.py``); without one the agent picks a random UUID.
- Save before acting: create = record(creating) -> file -> (fill) -> configfs -> record(ready);
  delete = record(deleting) -> configfs -> file -> drop record. Convergence finishes whatever a crash
  interrupted. A volume that must be filled stays ``creating`` (never exported) until the fill ends; a failed
  fill removes the half-made volume (record, configfs objects, file, work files).
- Concurrency: creates are serialised per name, everything else per volume UUID (``AgentParts.keys``).
"""

from __future__ import annotations

import logging
import os
import uuid as uuidlib
from collections.abc import Mapping
from contextlib import nullcontext

from nvmeof_csi.agent.configfs import NO_TARGET_AUTH
from nvmeof_csi.agent.filler import Filler
from nvmeof_csi.agent.parts import MODEL, NSID, AgentParts, VolumeView
from nvmeof_csi.agent.readonly_exports import ReadOnlyExports
from nvmeof_csi.agent.replica_ops import (
    backing_bytes,
    check_copy_source,
    check_replicable,
    check_same_pair,
    replica_stack,
    replication,
    unlink_everywhere,
)
from nvmeof_csi.agent.replica_spec import ReplicaSpec
from nvmeof_csi.agent.state import CREATING, DELETING, READY, VolumeRecord
from nvmeof_csi.errors import (
    Aborted,
    AlreadyExists,
    DriverError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    SlotsBusy,
    Unavailable,
)
from nvmeof_csi.host.keyring import NO_DAEMON, NO_KEYRING
from nvmeof_csi.nvmeof.nqn import namespace_nguid, readonly_nqn, volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters

log = logging.getLogger(__name__)


class VolumeOps:
    def __init__(self, parts: AgentParts) -> None:
        self._p = parts

    # -- create ------------------------------------------------------------------------------------------
    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: VolumeParameters,
        labels: Mapping[str, str],
        source_volume: str = "",
        source_snapshot: str = "",
        vol_uuid: str = "",
        replica: ReplicaSpec | None = None,
    ) -> VolumeView:
        p = self._p
        if not name:
            raise InvalidArgument("volume name is required")
        if capacity_bytes <= 0:
            raise InvalidArgument("capacity_bytes must be positive")
        # a create of this name that runs long (a dataset fill) makes a retry ABORTED after a while, never a
        # thread held for the whole fill
        with p.keys.hold(f"name:{name}", wait=p.name_wait):
            named = p.named_volumes(name)
            if named:
                found = named[0]
                self._check_same(found, capacity_bytes, parameters, source_volume, source_snapshot)
                check_same_pair(found, replica)
                if vol_uuid and found.uuid != vol_uuid:
                    raise AlreadyExists(
                        f"volume {name!r} exists on agent {p.name} as {found.uuid}, not as the reserved {vol_uuid}"
                    )
                if found.status == CREATING:
                    with p.keys.hold(found.uuid):
                        found = self._finish_creating(found)
                return p.view(found)
            self._check_auth(parameters)
            self._check_tls(parameters)
            if replica is not None or parameters.replicas > 1:
                check_replicable(p, parameters, source_volume or source_snapshot, replica)
            source_size = self._source_size(source_volume, source_snapshot)
            if capacity_bytes < source_size:
                raise OutOfRange(f"capacity {capacity_bytes} is smaller than the source's {source_size} bytes")
            rec = VolumeRecord(
                uuid=self._fresh_uuid(vol_uuid, name),
                name=name,
                capacity_bytes=capacity_bytes,
                parameters=parameters.to_map(),
                labels=dict(labels),
                source_volume=source_volume,
                source_snapshot=source_snapshot,
                status=CREATING,
                replica=replica.to_map() if replica is not None else {},
            )
            filler = self.filler_for(rec)  # refuse a volume to fill early when this agent has no filler
            # a fill slot before anything is saved: none free is RESOURCE_EXHAUSTED, never a wait on this thread
            with p.keys.hold(rec.uuid), filler.slot(wait=False) if filler is not None else nullcontext():
                with p.reserving(capacity_bytes):
                    rec = self._first_save(rec)
                rec = self.materialize_new(rec)
            log.info("volume %s (%s) created: %d bytes", rec.uuid, name, capacity_bytes)
            return p.view(rec)

    def _check_auth(self, parameters: VolumeParameters) -> None:
        """A volume with ``auth`` only on a kernel whose nvmet can authenticate hosts."""
        mode = parameters.auth
        if mode != "none" and not self._p.nvmet.supports_dhchap():
            raise FailedPrecondition(
                f"agent {self._p.name} cannot create a volume with auth {mode!r}: "
                f"{NO_TARGET_AUTH} (kernel {os.uname().release})"
            )

    def _check_tls(self, parameters: VolumeParameters) -> None:
        """A ``tls: psk`` volume only over NVMe/TCP, on an agent with a TLS portal, a kernel keyring for PSKs and
        a running TLS handshake daemon."""
        if parameters.tls == "none":  # a TLS volume over RDMA never parses (``VolumeParameters.parse``)
            return
        p = self._p
        if not p.keyring.available():
            raise FailedPrecondition(
                f"agent {p.name} cannot create a TLS volume: {NO_KEYRING} (kernel {os.uname().release})"
            )
        if not any(portal.tls for portal in p.portals):
            raise FailedPrecondition(f"agent {p.name} has no TLS portal (--portal ID:tcp:ADDR:PORT:GROUP:tls)")
        if not p.handshake_daemon():
            raise FailedPrecondition(f"agent {p.name} cannot create a TLS volume: {NO_DAEMON}")

    def _fresh_uuid(self, vol_uuid: str, name: str) -> str:
        """``vol_uuid`` (reserved by the controller) unless a record here holds it already; else a random one."""
        if not vol_uuid:
            return str(uuidlib.uuid4())
        held = self._p.state.current.volumes.get(vol_uuid)
        if held is not None and held.status == DELETING and held.name == name:
            raise Aborted(f"volume {vol_uuid} ({name!r}) is being deleted on agent {self._p.name}; retry")
        if held is not None:
            raise AlreadyExists(f"volume UUID {vol_uuid} is taken on agent {self._p.name} by {held.name!r}")
        return vol_uuid

    def _first_save(self, rec: VolumeRecord) -> VolumeRecord:
        """Save before acting: the record, stamped with this agent's clock, durable before anything is made.
        The caller holds the UUID's key, so two creates can never share a (reserved) UUID."""
        if rec.uuid in self._p.state.current.volumes:
            raise AlreadyExists(f"volume UUID {rec.uuid} is taken on agent {self._p.name}")
        return self._p.state.put_volume(rec.evolve(created_at=self._p.clock()))

    @staticmethod
    def _check_same(rec: VolumeRecord, capacity: int, params: VolumeParameters, src_vol: str, src_snap: str) -> None:
        if rec.capacity_bytes != capacity or rec.options.immutable() != params.immutable():
            raise AlreadyExists(f"volume {rec.name!r} exists with other capacity or parameters")
        if (rec.source_volume, rec.source_snapshot) != (src_vol, src_snap):
            raise AlreadyExists(f"volume {rec.name!r} exists with another content source")

    def _source_size(self, source_volume: str, source_snapshot: str) -> int:
        if source_volume and source_snapshot:
            raise InvalidArgument("a volume has at most one content source")
        if source_volume:
            source = self._p.volume(source_volume)
            check_copy_source(self._p, source)
            return source.capacity_bytes
        if source_snapshot:
            snap = self._p.state.current.snapshots.get(source_snapshot)
            if snap is None or snap.status != READY:
                raise NotFound(f"snapshot {source_snapshot} does not exist on agent {self._p.name}")
            return snap.size_bytes
        return 0

    def _finish_creating(self, seen: VolumeRecord) -> VolumeRecord:
        """Finish a create someone else may have been finishing meanwhile (re-read under the volume's key)."""
        current = self._p.state.current.volumes.get(seen.uuid)
        if current is None or current.status == DELETING:
            raise Unavailable(f"volume {seen.name!r} could not be created (its fill failed); retry")
        if current.status != CREATING:
            return current
        filler = self.filler_for(current)
        if filler is None:
            return self.materialize_new(current)
        try:
            with filler.slot(wait=False):
                return self.materialize_new(current)
        except SlotsBusy as busy:  # its record stays: the controller must not place the name elsewhere
            raise Aborted(f"volume {seen.name!r} waits for a fill slot ({busy}); retry") from busy

    def filler_for(self, rec: VolumeRecord) -> Filler | None:
        """The filler when ``rec`` must be filled (FAILED_PRECONDITION when this agent has none)."""
        if not rec.options.dataset is not None:
            return None
        if self._p.filler is None:
            raise FailedPrecondition(
                f"agent {self._p.name} has no Alluxio configured (--alluxio-proxy): it cannot create dataset volumes"
            )
        return self._p.filler

    def materialize_new(self, rec: VolumeRecord) -> VolumeRecord:
        """:meth:`materialize` for a create; a volume whose fill fails is removed again (nothing half-created
        is left: record, configfs objects, backing file and work files all go)."""
        try:
            return self.materialize(rec)
        except Exception:  # any failure, not only domain errors: nothing half-made may stay
            if rec.options.dataset is not None and self._p.filler is not None:
                log.warning("volume %s (%s): fill failed; removing the volume", rec.uuid, rec.name)
                self.teardown(self._p.state.put_volume(rec.evolve(status=DELETING)))
                self._discard_work(rec)
                self._release_dataset(rec)  # the hold taken before the fill: never a data set pinned forever
            raise

    def _release_dataset(self, rec: VolumeRecord) -> None:
        p = self._p
        if rec.options.dataset is not None and p.filler is not None:
            others = [v.options.dataset for v in p.live_volumes() if v.uuid != rec.uuid]
            p.filler.release(rec.options.dataset, [d for d in others if d is not None])

    def _discard_work(self, rec: VolumeRecord) -> None:
        if self._p.filler is not None:
            self._p.filler.discard(rec.uuid)

    def materialize(self, rec: VolumeRecord) -> VolumeRecord:
        """Make file and configfs match ``rec`` (creating -> ready). Caller holds the volume's key."""
        p = self._p
        path = p.store.volume_path(rec.uuid)
        size = backing_bytes(rec)
        if not path.exists():
            if rec.status == READY:
                raise FailedPrecondition(f"backing file of ready volume {rec.uuid} is missing; refusing to recreate")
            if rec.source_snapshot:
                p.store.clone(p.store.snapshot_path(rec.source_snapshot), path, rec.capacity_bytes)
            elif rec.source_volume:
                p.store.clone(p.store.volume_path(rec.source_volume), path, rec.capacity_bytes)
            else:
                p.store.create(path, size)
        else:
            p.store.grow(path, size)
        filler = self.filler_for(rec)
        if filler is not None and rec.options.dataset is not None and rec.status != READY:  # filled, then exported
            labels = filler.fill(rec.uuid, rec.options.dataset, path, rec.capacity_bytes)
            rec = p.state.put_volume(rec.evolve(labels={**rec.labels, **labels}))
        nqn = volume_nqn(rec.uuid)
        p.nvmet.ensure_subsystem(nqn, serial=rec.uuid.replace("-", "")[:20], model=MODEL)
        stack = replica_stack(p, rec, path)
        p.nvmet.ensure_namespace(
            nqn, NSID, stack.device, rec.uuid, namespace_nguid(rec.uuid), p.buffered_io, enable=stack.enable
        )
        for host_nqn in p.writers(rec):  # read-only hosts reach only the read-only subsystem
            p.nvmet.ensure_host(host_nqn, rec.hosts[host_nqn], rec.ctrl_keys.get(host_nqn, ""))
            p.nvmet.allow(nqn, host_nqn)
        for host_nqn in set(p.nvmet.allowed_hosts(nqn)) - set(p.writers(rec)):
            p.nvmet.deny(nqn, host_nqn)
        if stack.linked:
            p.export(rec, nqn, p.writers(rec))
        else:
            unlink_everywhere(p, nqn)
        ReadOnlyExports(p).ensure(rec)
        if rec.status != READY:  # not flushed unless a fill would have to run again (see agent.state)
            rec = p.state.put_volume(rec.evolve(status=READY), flush_renames=filler is not None)
            self._discard_work(rec)
        return rec

    # -- delete and resize ---------------------------------------------------------------------------------
    def delete_volume(self, vol_uuid: str) -> None:
        p = self._p
        with p.keys.hold(vol_uuid):
            rec = p.state.current.volumes.get(vol_uuid)
            if rec is None:
                return
            if rec.status != DELETING:
                rec = p.state.put_volume(rec.evolve(status=DELETING))  # save before acting
            self.teardown(rec)
            self._discard_work(rec)
            self._release_dataset(rec)
        log.info("volume %s (%s) deleted", vol_uuid, rec.name)

    def teardown(self, rec: VolumeRecord) -> None:
        """Remove configfs objects, host entries no other volume allows, the file, then the record."""
        p = self._p
        nqn = volume_nqn(rec.uuid)
        if p.nvmet.has_subsystem(nqn):
            p.nvmet.remove_subsystem(nqn)
        if rec.readonly_hosts or p.nvmet.has_subsystem(readonly_nqn(rec.uuid)):
            ReadOnlyExports(p).remove(rec)
        for host_nqn in rec.hosts:
            p.nvmet.remove_host(host_nqn)
        p.drop_psks(rec, rec.hosts)
        if rec.replica:
            replication(p).remove(rec, p.store.volume_path(rec.uuid))
        p.store.delete(p.store.volume_path(rec.uuid))
        p.state.drop_volume(rec.uuid)

    def resize_volume(self, vol_uuid: str, capacity_bytes: int) -> VolumeView:
        p = self._p
        with p.keys.hold(vol_uuid):
            rec = p.volume(vol_uuid)
            if capacity_bytes > rec.capacity_bytes:
                with p.reserving(capacity_bytes - rec.capacity_bytes):  # the high-water mark holds for growth too
                    rec = p.state.put_volume(rec.evolve(capacity_bytes=capacity_bytes))
                p.store.grow(p.store.volume_path(vol_uuid), backing_bytes(rec))
                if rec.replica:
                    replication(p).resize(rec, p.store.volume_path(vol_uuid))
                if p.nvmet.namespace_enabled(volume_nqn(vol_uuid), NSID):  # a secondary's shows its size once enabled
                    p.nvmet.revalidate(volume_nqn(vol_uuid), NSID)
                ReadOnlyExports(p).refresh(rec)
            return p.view(rec)

    def modify_volume(self, vol_uuid: str, changes: Mapping[str, str]) -> VolumeView:
        """Record new values of mutable parameters with the volume (saved before it returns); idempotent."""
        p = self._p
        with p.keys.hold(vol_uuid):
            rec = p.volume(vol_uuid)
            merged = rec.options.with_changes(changes).to_map()
            if merged != dict(rec.parameters):
                rec = p.state.put_volume(rec.evolve(parameters=merged))
            return p.view(rec)

    # -- fills a restart interrupted ---------------------------------------------------------------------
    def resume_fills(self) -> None:
        """Finish volumes whose fill a restart interrupted (the filler resumes, it does not restart); a fill
        that fails now removes its volume, as a failed create does. Run after the agent serves."""
        p = self._p
        for rec in list(p.state.current.volumes.values()):
            if rec.status != CREATING or not rec.options.dataset is not None:
                continue
            with p.keys.hold(f"name:{rec.name}"), p.keys.hold(rec.uuid):
                current = p.state.current.volumes.get(rec.uuid)
                if current is None or current.status != CREATING:
                    continue
                filler = self.filler_for(current)
                try:
                    with filler.slot(wait=True) if filler is not None else nullcontext():  # a background thread
                        self.materialize_new(current)
                    log.info("volume %s (%s): resumed fill finished", rec.uuid, rec.name)
                except DriverError as err:
                    log.warning("volume %s (%s): resumed fill failed, volume removed: %s", rec.uuid, rec.name, err)
