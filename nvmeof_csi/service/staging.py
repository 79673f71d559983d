"""Node logic, written once for every connector: stage, publish, unpublish, unstage, stats, expansion.

Contract:
- Idempotent: repeating an RPC that succeeded changes nothing and succeeds again; a call incompatible with
  what is already there (another staging path, another access type) raises ``AlreadyExists``.
- Save before you act: the staging record is written before the connector or a mount is touched, and a
  failed stage is undone in reverse order (unmount, disconnect, drop the record).
- Callers hold the per-volume lock; the connector serialises shared connections itself.
- Confinement: every staging and target path must be absolute, normalised and under ``root`` (the kubelet
  root; ``InvalidArgument`` otherwise). Unstage and unpublish act only on the paths the staging record holds:
  a path the record does not name is never unmounted or removed (success: nothing of ours is there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from nvmeof_csi.errors import AlreadyExists, DriverError, FailedPrecondition, InvalidArgument, NotFound
from nvmeof_csi.host.cgroups import check_pod_uid
from nvmeof_csi.host.filesystems import Filesystems, device_size, usage
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.host.paths import confined
from nvmeof_csi.rpc.locks import KeyedMutex
from nvmeof_csi.service.contracts import NO_SECRETS, Condition, Connector, Health, Problem, VolumeRef
from nvmeof_csi.service.qos import LimitsSource, PassLimits, QosEnforcer
from nvmeof_csi.service.records import AccessSpec, StagingRecord, StagingStore, VolumeStats, mount_options
from nvmeof_csi.service.unstage_by_id import unstage_by_id

log = logging.getLogger(__name__)
DEFAULT_FS = "ext4"
#: where kubelet puts staging and target paths; the node touches nothing outside it
DEFAULT_ROOT = Path("/var/lib/kubelet")


def _key(ref: VolumeRef) -> str:
    return f"{ref.location}/{ref.uuid}"


class StagingService:
    """NodeStage/Publish/Unpublish/Unstage/Stats/Expand over injected connector, mounter and filesystems."""

    def __init__(
        self,
        connector: Connector,
        mounter: Mounter,
        filesystems: Filesystems,
        store: StagingStore,
        size_of: Callable[[str], int] = device_size,
        root: Path = DEFAULT_ROOT,
        qos: QosEnforcer | None = None,
        limits_source: LimitsSource | None = None,
    ) -> None:
        self._qos = qos
        self._limits_source = limits_source
        self._connector = connector
        self._mounter = mounter
        self._fs = filesystems
        self._store = store
        self._size_of = size_of
        self._root = root
        self._limits_lock = KeyedMutex()  # unpublish vs the QoS loop: a removed io.max line stays removed

    def _path(self, text: str, what: str) -> str:
        return confined(self._root, text, what)

    # -- stage ---------------------------------------------------------------------------------------
    def stage(
        self,
        volume_id: str,
        ref: VolumeRef,
        staging_path: str,
        access: AccessSpec,
        context: Mapping[str, str],
        timeout: float,
        secrets: Mapping[str, str] = NO_SECRETS,
    ) -> None:
        staging_path = self._path(staging_path, "staging_target_path")
        existing = self._store.load(ref)
        if existing is not None:
            if existing.staging_path != staging_path or existing.access.block != access.block:
                raise AlreadyExists(
                    f"volume {volume_id} is already staged at {existing.staging_path} "
                    f"({'block' if existing.access.block else 'mount'})"
                )
            record = existing
        else:
            record = StagingRecord(volume_id, ref, staging_path, access, dict(context))
            self._store.save(record)  # save before acting
        connected = mounted = False
        try:
            device = self._connector.connect(ref, record.context, timeout, secrets)
            connected = True
            if device != record.device:
                record = record.with_device(device)
                self._store.save(record)
            if access.block and access.readonly:
                self._fs.set_readonly(device)  # the device itself refuses writes, whatever opens it
            if not access.block:
                mounted = self._mount_staging(record)
        except BaseException:
            if existing is None:
                self._undo_stage(record, connected, mounted)
            raise

    def _mount_staging(self, record: StagingRecord) -> bool:
        """Mount the filesystem at the staging path (mkfs only a blank device); True if this call mounted."""
        path = record.staging_path
        current = self._mounter.mount_at(path)
        if current is not None:
            if current.source != record.device:
                raise AlreadyExists(f"staging path {path} already has {current.source} mounted")
            return False
        fs_type = record.access.fs_type or DEFAULT_FS
        found = self._fs.probe(record.device)
        if found is None and record.access.readonly:
            raise FailedPrecondition(
                f"volume {record.volume_id} has no filesystem, and a read-only volume is never "
                "formatted; stage it writable once first"
            )
        if found is None:
            log.info("creating %s on blank %s for %s", fs_type, record.device, record.volume_id)
            self._fs.make(record.device, fs_type)
        elif found != fs_type:
            raise FailedPrecondition(
                f"volume {record.volume_id} holds {found}, but {fs_type} was requested; refusing to reformat"
            )
        self._mounter.make_mount_point(path)
        self._mounter.mount(record.device, path, fs_type, mount_options(record.access, fs_type))
        return True

    def _undo_stage(self, record: StagingRecord, connected: bool, mounted: bool) -> None:
        """Reverse a failed first stage; each step is best-effort and logged."""
        steps: list[tuple[str, Callable[[], None]]] = []
        if mounted:
            steps.append(("unmount", lambda: self._mounter.unmount(record.staging_path)))
        if connected:
            steps.append(("disconnect", lambda: self._disconnect(record)))
        steps.append(("drop record", lambda: self._store.remove(record.ref)))
        for what, step in steps:
            try:
                step()
            except Exception:
                log.exception("rollback of stage %s: %s failed", record.volume_id, what)

    def _disconnect(self, record: StagingRecord) -> None:
        in_use = self._store.refs() - {record.ref}  # names only: an unstage reads one record, not all
        self._connector.disconnect(record.ref, record.context, in_use)

    # -- unstage -------------------------------------------------------------------------------------
    def unstage(self, ref: VolumeRef, staging_path: str) -> None:
        staging_path = self._path(staging_path, "staging_target_path")
        record = self._store.load(ref)
        if record is None:  # nothing of ours is staged, unless its record was set aside: then by the volume ID
            if self._store.is_quarantined(ref):
                unstage_by_id(self._connector, self._mounter, ref, staging_path, self._store.refs() - {ref})
            return
        if record.staging_path != staging_path:
            raise FailedPrecondition(
                f"volume {record.volume_id} is staged at {record.staging_path}, not {staging_path}"
            )
        self._mounter.unmount(staging_path)
        if record.targets:
            live = [t for t in record.targets if self._mounter.mount_at(t) is not None]
            if live:
                raise FailedPrecondition(f"volume {record.volume_id} is still published at {', '.join(live)}")
        if record.access.block and record.access.readonly and record.device:
            self._fs.set_readonly(record.device, False)  # the next stage may be writable
        self._disconnect(record)
        self._store.remove(ref)
        if self._qos is not None:
            self._qos.forget(ref)

    # -- publish -------------------------------------------------------------------------------------
    def publish(
        self, ref: VolumeRef, staging_path: str, target: str, access: AccessSpec, readonly: bool, pod_uid: str = ""
    ) -> None:
        """Bind-mount the staged volume at ``target``; with ``pod_uid`` (kubelet's podInfoOnMount) the volume's
        per-pod limits are applied to that pod's cgroup (see :class:`QosEnforcer`: never fails the publish)."""
        staging_path = self._path(staging_path, "staging_target_path")
        target = self._path(target, "target_path")
        if pod_uid:
            check_pod_uid(pod_uid)
        record = self._store.load(ref)
        if record is None or record.staging_path != staging_path:
            raise FailedPrecondition(f"volume {ref.uuid} is not staged at {staging_path}")
        if record.access.block != access.block:
            raise AlreadyExists(f"volume {ref.uuid} was staged for {'block' if record.access.block else 'mount'}")
        readonly = readonly or record.access.readonly  # a read-only stage is published read-only only
        current = self._mounter.mount_at(target)
        if current is not None:
            if target in record.targets and record.targets[target] == readonly:
                self._limit(record, pod_uid)
                return
            raise AlreadyExists(f"target path {target} is already in use with other options")
        busy = [t for t in record.targets if t != target and self._mounter.mount_at(t) is not None]
        if access.single_target and busy:
            raise FailedPrecondition(
                f"volume {ref.uuid} has access mode SINGLE_NODE_SINGLE_WRITER and is already published at {busy[0]}"
            )
        for other, ro in record.targets.items():
            if other != target and ro != readonly and self._mounter.mount_at(other) is not None:
                log.info("volume %s also published at %s (readonly=%s)", ref.uuid, other, ro)
        record = record.with_target(target, readonly, pod_uid)
        self._store.save(record)  # save before acting
        if access.block:
            self._mounter.make_mount_point(target, block=True)
            source = self._connector.find_device(ref, record.context) or record.device
            self._mounter.bind(source, target, readonly)
        else:
            self._mounter.make_mount_point(target)
            self._mounter.bind(staging_path, target, readonly, access.mount_flags)
        self._limit(record, pod_uid)

    def _limit(self, record: StagingRecord, pod_uid: str) -> None:
        if self._qos is None or not pod_uid or not record.device:
            return
        why = self._qos.apply(record, pod_uid, record.device)
        if why:
            log.warning(
                "volume %s published for pod %s, but its limits are not in force yet: %s",
                record.volume_id,
                pod_uid,
                why,
            )

    def unpublish(self, ref: VolumeRef, target: str) -> None:
        target = self._path(target, "target_path")
        record = self._store.load(ref)
        if record is None or target not in record.targets:
            return  # never published there by us: nothing to unmount or remove
        self._mounter.unmount(target)
        with self._limits_lock.hold(_key(ref)):  # the QoS loop must not re-apply the line removed here
            record = self._store.load(ref) or record
            pod_uid = record.pods.get(target, "")
            if self._qos is not None and pod_uid and record.device:
                others = [t for t, p in record.pods.items() if p == pod_uid and t != target]
                if not others:  # the pod's last publish of this volume: its line goes
                    self._qos.remove(record.volume_id, pod_uid, record.device)
            self._mounter.remove_mount_point(target)
            self._store.save(record.without_target(target))

    # -- start-up ------------------------------------------------------------------------------------------
    def reconcile(self, timeout: float) -> list[str]:
        """Compare the staging records with the kernel (see ``Connector.reconcile``); returns the actions. A record
        the connector cannot use is quarantined first, so that one bad record never stops the start."""
        usable, actions = [], []
        for record in self._store.all():
            try:
                self._connector.check_context(record.ref, record.context)
            except DriverError as exc:
                self._store.quarantine(record.ref, exc)
                actions.append(f"volume {record.ref.uuid}: staging record quarantined ({exc})")
                continue
            usable.append((record.ref, record.context))
        return actions + self._connector.reconcile(usable, timeout)

    # -- stats / expand ------------------------------------------------------------------------------
    def _record_for_path(self, ref: VolumeRef, volume_path: str) -> StagingRecord:
        try:
            volume_path = self._path(volume_path, "volume_path")
        except InvalidArgument as exc:  # nothing of ours can be there
            raise NotFound(f"volume {ref.uuid} is not at {volume_path[:300]!r}: {exc}") from exc
        record = self._store.load(ref)
        if record is None:
            raise NotFound(f"volume {ref.uuid} is not staged on this node")
        if volume_path != record.staging_path and volume_path not in record.targets:
            raise NotFound(f"volume {ref.uuid} is not staged or published at {volume_path}")
        if not self._mounter.exists(volume_path):
            raise NotFound(f"path {volume_path} does not exist")
        return record

    def health(self, ref: VolumeRef) -> Condition:
        """The paths of a volume staged here (``NotFound`` when it is not staged on this node)."""
        record = self._store.load(ref)
        if record is None:
            raise NotFound(f"volume {ref.uuid} is not staged on this node")
        return self._with_limits(record, self._connector.condition(ref, record.context))

    def _with_limits(self, record: StagingRecord, condition: Condition) -> Condition:
        """Adds DEGRADED ``LimitNotEnforced`` when a published pod's I/O limits are not in force."""
        if self._qos is None:
            return condition
        missing = [p for p in self._qos.status(record) if not p.enforced]
        if not missing:
            return condition
        message = "; ".join(f"pod {p.pod_uid}: {p.reason}" for p in missing)
        problem = Problem("degraded", "LimitNotEnforced", f"I/O limits not in force: {message}")
        return Condition(
            True, condition.message if condition.abnormal else problem.message, (*condition.issues(), problem)
        )

    def qos_records(self) -> list[StagingRecord]:
        """The staging records (for the limits reconcile loop and the metrics)."""
        return self._store.all()

    def reconcile_limits(self) -> list[str]:
        """The node's periodic pass: release subsystems whose release failed before and that nothing claims, roll
        every staged volume's live connections to its current keys, fetch the
        current limits of every published volume (live changes), and re-apply every published pod's limits that
        are not in force."""
        actions = self._connector.retry_orphans([(r.ref, r.context) for r in self._store.all()])
        source = self._limits_source
        if isinstance(source, PassLimits):
            source = source.for_pass()  # one listing per agent for the whole pass, not one call per volume
        for listed in self._store.all():
            with self._limits_lock.hold(_key(listed.ref)):
                record = self._store.load(listed.ref)  # as it is now, not as it was listed (see unpublish)
                if record is None:
                    continue
                try:
                    actions += self._connector.refresh_keys(record.ref, record.context)
                    if self._qos is None:
                        continue
                    if source is not None and record.pods:
                        actions += self._qos.refresh(record, source)
                    actions += self._qos.reconcile([record])
                except (DriverError, OSError, ValueError) as exc:  # one volume's trouble never stops the pass
                    log.warning("QoS pass: volume %s skipped: %s", record.volume_id, exc)
                    actions.append(f"{record.volume_id}: skipped ({exc})")
        return actions

    def storage_health(self) -> Health:
        """The node's initiator: fabrics modules, native multipath."""
        return self._connector.health()

    def quarantined_records(self) -> list[str]:
        """Staging records set aside (unreadable, or a context the connector cannot use)."""
        return self._store.quarantined()

    def stats(self, ref: VolumeRef, volume_path: str) -> VolumeStats:
        record = self._record_for_path(ref, volume_path)
        condition = self._connector.condition(ref, record.context)
        device = self._connector.find_device(ref, record.context)
        size = self._size_of(device) if device else 0
        if record.access.block:
            return VolumeStats(True, size, None, condition)
        return VolumeStats(False, size, usage(volume_path), condition)

    def expand(self, ref: VolumeRef, volume_path: str) -> int:
        record = self._record_for_path(ref, volume_path)
        device = self._connector.find_device(ref, record.context)
        if device is None:
            raise FailedPrecondition(f"volume {ref.uuid} is staged but its device is not present")
        size = self._connector.refresh_size(ref, record.context, device)
        if not record.access.block:
            fs_type = self._fs.probe(device) or record.access.fs_type or DEFAULT_FS
            self._fs.grow(device, record.staging_path, fs_type)
        return size
