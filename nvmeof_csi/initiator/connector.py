"""The node's ``Connector`` over the kernel NVMe-oF initiator (nvme-tcp, nvme-rdma, native multipath).

Contract (in addition to ``service/contracts.py``):
- ``connect`` refuses a volume whose features this node lacks (``initiator/features.py``: FAILED_PRECONDITION
  naming each and its fix, before anything connects), then makes one controller per portal of the volume context
  (TCP or RDMA) with bounded tunables (StorageClass values override the defaults), using this node's host NQN and
  host ID; portals that already have a controller are left alone ("already connected" is success). It succeeds
  when at least one path is up and the namespace with the volume's UUID appears (found in sysfs, bounded by the
  caller's timeout); then it returns the native-multipath head device. A multi-portal volume with native
  multipath off is refused with FAILED_PRECONDITION unless single-path staging is allowed (then only the first
  portal is used).
- ``disconnect`` removes the controllers of the volume's subsystem (whole-NQN match, so ``vol1`` never
  touches ``vol10``), unless another staged volume still uses that subsystem. Controllers we did not make
  (other NQNs) are never touched.
- ``reconcile`` releases controllers of the driver's subsystems that no staging record claims, except when
  one of their devices is mounted, held or open (then it is kept and reported). A subsystem whose disconnect
  fails is logged, counted (``orphan_stats``) and remembered; the others are still released and the start goes
  on; ``retry_orphans`` (the node's periodic pass) tries the remembered ones again while nothing claims them.
- ``condition`` is abnormal when a path is not live, naming the paths ("1 of 2 paths live: tcp:...:4421 connecting").
- A volume with ``auth`` (DH-HMAC-CHAP) is connected with the keys its agent issued to this node, fetched with
  the node's own identity (``host_keys``, ``agentclient/limits.py``; ``nvmeof/dhchap.py``), written to
  ``/dev/nvme-fabrics`` directly so no key is ever on a command line; a kernel without host authentication, or
  a node with no way to fetch keys, is ``FailedPrecondition``, a key the target rejects (or a target that fails
  to prove its controller key) is ``PermissionDenied``; ``refresh_keys`` rolls live controllers to the agent's
  current keys. ``reconcile`` does not reconnect such a volume: the kernel keeps reconnecting its controllers.
Commands are argv lists with timeouts; kernel state is read from sysfs.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from nvmeof_csi.errors import (
    CommandError,
    DeadlineExceeded,
    DriverError,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    Unavailable,
)
from nvmeof_csi.host.devices import device_in_use
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.host.keyring import NvmeKeyring
from nvmeof_csi.initiator.fabrics import FabricsDevice, FabricsError
from nvmeof_csi.initiator.features import NodeFeatures
from nvmeof_csi.initiator.identity import HostIdentity
from nvmeof_csi.initiator.keys import ConnectKeys
from nvmeof_csi.initiator.orphans import OrphanReleaser
from nvmeof_csi.initiator.rekey import roll_keys
from nvmeof_csi.initiator.sysfs import NvmeSysfs, Subsystem, paths_condition
from nvmeof_csi.initiator.uevents import EventWait, PollingWait
from nvmeof_csi.nvmeof.context import TUNABLES, Portal, VolumeContext
from nvmeof_csi.nvmeof.dhchap import HostKeys
from nvmeof_csi.nvmeof.nqn import readonly_namespace_uuid, readonly_nqn, volume_nqn
from nvmeof_csi.nvmeof.tlspsk import identity
from nvmeof_csi.service.contracts import NO_SECRETS, Condition, Health, OrphanStats, VolumeRef

log = logging.getLogger(__name__)
CONNECT_TIMEOUT = 60.0


def _nqns_of(refs: Iterable[VolumeRef]) -> set[str]:
    """Every subsystem NQN the volumes ``refs`` may be reached through (their own and their read-only one): what
    a volume claims, whatever its context says (a context names one of these or is refused, ``_context``)."""
    return {nqn for ref in refs for nqn in (volume_nqn(ref.uuid), readonly_nqn(ref.uuid))}


def _context(ref: VolumeRef, context: Mapping[str, str]) -> VolumeContext:
    """The typed context, checked against the volume ID before anything is connected: the NQN must be this
    volume's NQN and the namespace UUID its UUID, or both those of its read-only subsystem (a read-only
    attachment: ``agent/readonly.py``); ``InvalidArgument`` otherwise."""
    ctx = VolumeContext.from_dict(context)
    pairs = {(volume_nqn(ref.uuid), ref.uuid.lower()), (readonly_nqn(ref.uuid), readonly_namespace_uuid(ref.uuid))}
    if (ctx.nqn, ctx.namespace_uuid.lower()) not in pairs:
        raise InvalidArgument(
            f"volume context (nqn {ctx.nqn!r}, namespace {ctx.namespace_uuid!r}) does not belong to volume {ref.uuid}"
        )
    return ctx


class NvmeofConnector:
    def __init__(
        self,
        executor: Executor,
        sysfs: NvmeSysfs,
        identity: HostIdentity,
        allow_single_path: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        block_events: Callable[[], AbstractContextManager[EventWait]] | None = None,
        in_use: Callable[[str], str] = device_in_use,
        fabrics: FabricsDevice | None = None,
        host_keys: Callable[[VolumeRef], HostKeys] | None = None,
        features: NodeFeatures | None = None,
        keyring: NvmeKeyring | None = None,
    ) -> None:
        self._exec = executor
        self._sysfs = sysfs
        self._identity = identity
        self._single_path = allow_single_path
        self._sleep = sleep
        self._clock = clock
        self._events = block_events or self._polling
        self._in_use = in_use
        self._fabrics = fabrics or FabricsDevice()
        self._host_keys = host_keys
        self._keyring = keyring
        self._features = features  # None: no checks (tests on fake sysfs trees)
        self._orphans = OrphanReleaser(executor, sysfs, in_use, CONNECT_TIMEOUT)

    @contextmanager
    def _polling(self) -> Iterator[EventWait]:
        yield PollingWait(self._sleep, 0.1)

    def health(self) -> Health:
        """Not ready without the fabrics layer or multipath; ``gaps``: features asked of it that it lacks now."""
        if not (self._sysfs.root / "class" / "nvme-fabrics").exists() and not Path("/dev/nvme-fabrics").exists():
            return Health(False, "nvme-fabrics is not loaded (modprobe nvme-tcp / nvme-rdma)")
        if self._sysfs.multipath_enabled() is False and not self._single_path:
            return Health(False, "native NVMe multipath is off (nvme_core.multipath=N)")
        gaps = self._features.asked_gaps() if self._features is not None else ()
        return Health(True, f"initiator ready as {self._identity.nqn}", gaps)

    def _portals(self, ref: VolumeRef, ctx: VolumeContext) -> list[Portal]:
        portals = list(ctx.portals)
        if len(portals) > 1 and self._sysfs.multipath_enabled() is False:
            if not self._single_path:
                raise FailedPrecondition(
                    f"volume {ref.uuid} has {len(portals)} portals but native NVMe multipath is off "
                    "(nvme_core.multipath=N); enable it, or allow single-path staging"
                )
            portals = portals[:1]
        return portals

    def _connect_options(self, portal: Portal, ctx: VolumeContext, keys: HostKeys) -> list[tuple[str, str | None]]:
        """The kernel connect options of one path (what ``nvme connect`` would write), with the keys."""
        options: list[tuple[str, str | None]] = [
            ("transport", portal.trtype),
            ("traddr", portal.traddr),
            ("trsvcid", portal.trsvcid),
            ("nqn", ctx.nqn),
            ("hostnqn", self._identity.nqn),
            ("hostid", self._identity.host_id),
        ]
        for tunable in TUNABLES:
            value = ctx.tunable(tunable.key)
            value = tunable.default if value is None else value
            if tunable.option and value is not None:
                options.append((tunable.option, str(value)))
        if keys.key:
            options.append(("dhchap_secret", keys.key))
        if keys.ctrl_key:
            options.append(("dhchap_ctrl_secret", keys.ctrl_key))
        if ctx.tls != "none":
            options.append(("tls", None))  # the kernel finds the PSK in .nvme by identity (initiator/keys.py)
        return options

    def _connect_one(self, ref: VolumeRef, portal: Portal, ctx: VolumeContext, keys: HostKeys) -> None:
        """One path, written straight to ``/dev/nvme-fabrics`` (what ``nvme connect`` writes, without its scan of
        every controller on the node, which grows with their number; and no key on any command line).
        "Already connected" (EALREADY) returns quietly; a refused authentication raises ``PermissionDenied``,
        any other refusal the kernel's :class:`FabricsError` (its errno)."""
        try:
            name = self._fabrics.connect(self._connect_options(portal, ctx, keys))
        except FabricsError as err:
            if err.errno == errno.EALREADY:
                return
            if keys.key and err.errno in (errno.EKEYREJECTED, errno.EACCES, errno.EPERM):
                raise PermissionDenied(
                    f"volume {ref.uuid}: {portal.key} refused DH-HMAC-CHAP authentication of host "
                    f"{self._identity.nqn} ({err.strerror}): the agent's keys for this host changed, or the target "
                    "failed to prove its controller key"
                ) from None
            raise
        log.info("volume %s: %s connected%s (%s)", ref.uuid, portal.key, " with DH-HMAC-CHAP" if keys.key else "", name)

    def refresh_keys(self, ref: VolumeRef, context: Mapping[str, str]) -> list[str]:
        """An ``auth`` volume's live controllers take the keys its agent issues now (``initiator/rekey.py``)."""
        ctx = _context(ref, context)
        if ctx.auth == "none" or self._host_keys is None:
            return []
        actions = roll_keys(self._sysfs, ref.uuid, ctx.nqn, self._host_keys(ref))
        self._sysfs.narrow_secrets(ctx.nqn)  # each pass: a controller made meanwhile is narrowed too
        return actions

    def connect(
        self, ref: VolumeRef, context: Mapping[str, str], timeout: float, secrets: Mapping[str, str] = NO_SECRETS
    ) -> str:
        deadline = self._clock() + timeout
        ctx = _context(ref, context)
        if self._features is not None:
            self._features.check(ref.uuid, ctx, self._single_path)  # FAILED_PRECONDITION before anything connects
        keys = ConnectKeys(
            self._fabrics, self._identity.nqn, self._host_keys, self._keyring, features=self._features
        ).for_volume(ref, ctx)
        nqn, ns_uuid = ctx.nqn, ctx.namespace_uuid
        portals = self._portals(ref, ctx)
        with self._events() as events:  # listening before connecting: no uevent can slip past
            sub = self._sysfs.subsystem(nqn)
            have = {c.portal for c in sub.controllers} if sub else set()
            errors = []
            for portal in portals:
                if portal.key in have:
                    continue
                if deadline - self._clock() <= 0:
                    break
                try:
                    self._connect_one(ref, portal, ctx, keys)
                except FabricsError as err:  # this path is refused; the others may still come up
                    errors.append(f"{portal.key}: {err}")
                    log.warning("volume %s: connect %s failed: %s", ref.uuid, portal.key, err)
            self._sysfs.apply_tunables(ctx)
            self._sysfs.narrow_secrets(nqn)  # the keys in sysfs: root only, never every pod's to read
            log.debug("volume %s: waiting for namespace %s (%s)", ref.uuid, ns_uuid, events.source)
            return self._wait_for_namespace(ref, nqn, ns_uuid, deadline, errors, events)

    def _wait_for_namespace(
        self, ref: VolumeRef, nqn: str, ns_uuid: str, deadline: float, errors: list[str], events: EventWait
    ) -> str:
        rescanned = False
        while True:
            sub = self._sysfs.subsystem(nqn)
            if sub is None and errors:
                raise Unavailable(f"volume {ref.uuid}: no path could be connected: {'; '.join(errors)}")
            if sub is not None and sub.live():
                ns = next((n for n in sub.namespaces if n.uuid.lower() == ns_uuid.lower()), None)
                if ns is not None:
                    return ns.device
                if not rescanned:  # a namespace added to an already-connected subsystem needs a rescan
                    self._rescan(sub)
                    rescanned = True
            if self._clock() >= deadline:
                raise DeadlineExceeded(f"volume {ref.uuid}: namespace {ns_uuid} did not appear under {nqn} in time")
            events.wait(deadline - self._clock())

    def _rescan(self, sub: Subsystem) -> None:
        for ctrl in sub.live():
            try:
                (self._sysfs.root / "class" / "nvme" / ctrl.name / "rescan_controller").write_text("1")
            except OSError as exc:
                log.warning("rescan of %s failed: %s", ctrl.name, exc)

    def find_device(self, ref: VolumeRef, context: Mapping[str, str]) -> str | None:
        ns = self._sysfs.find_namespace(_context(ref, context).namespace_uuid)
        return ns.device if ns is not None else None

    def disconnect(self, ref: VolumeRef, context: Mapping[str, str], in_use: frozenset[VolumeRef]) -> None:
        ctx = _context(ref, context)
        nqn = ctx.nqn
        if any(volume_nqn(other.uuid) == nqn for other in in_use if other != ref):
            log.info("volume %s: subsystem %s still used by another staged volume; kept", ref.uuid, nqn)
            return
        sub = self._sysfs.subsystem(nqn)
        if sub is not None and sub.controllers:
            try:  # every path in one call (one process, not one per path: the way down is timed against this)
                self._exec.run(["nvme", "disconnect", "-n", nqn], timeout=CONNECT_TIMEOUT)
            except CommandError:
                still = self._sysfs.subsystem(nqn)
                if still is not None and still.controllers:
                    raise
                log.info("subsystem %s: its controllers were already gone", nqn)
        # the PSK goes with the last connection, unless this very kernel's target exports the subsystem (one
        # machine as target and host, as `serve --mode all`: one keyring, the key is the target's as well)
        if ctx.tls != "none" and not (self._sysfs.root / "kernel/config/nvmet/subsystems" / nqn).exists():
            (self._keyring or NvmeKeyring()).drop_psk(identity(self._identity.nqn, nqn))

    def refresh_size(self, ref: VolumeRef, context: Mapping[str, str], device: str) -> int:
        ctx = _context(ref, context)
        sub = self._sysfs.subsystem(ctx.nqn)
        if sub is not None:
            self._rescan(sub)
        ns_uuid = ctx.namespace_uuid
        sizes = []
        for _ in range(50):  # the new size shows up after the rescan completes
            ns = self._sysfs.find_namespace(ns_uuid)
            sizes.append(ns.size_bytes if ns else 0)
            if len(sizes) >= 3 and sizes[-1] == sizes[-2] == sizes[-3]:
                break
            self._sleep(0.1)
        return sizes[-1]

    def check_context(self, ref: VolumeRef, context: Mapping[str, str]) -> None:
        _context(ref, context)

    def reconcile(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]], timeout: float) -> list[str]:
        actions = []
        claimed_nqns = set()
        for ref, context in claimed:
            ctx = _context(ref, context)
            claimed_nqns.add(ctx.nqn)
            if ctx.auth != "none":
                continue  # no secret here; the kernel keeps reconnecting with its keys, kubelet re-stages
            before = self._sysfs.subsystem(ctx.nqn)
            have = {c.portal for c in before.controllers} if before else set()
            missing = [p.key for p in ctx.portals if p.key not in have]
            if not missing:
                continue
            try:
                self.connect(ref, context, timeout)
                actions.append(f"volume {ref.uuid}: reconnected {', '.join(missing)}")
            except DriverError as err:
                actions.append(f"volume {ref.uuid}: could not reconnect {', '.join(missing)}: {err}")
        return actions + self._orphans.release(claimed_nqns)

    def retry_orphans(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]]) -> list[str]:
        if not self._orphans.unreleased:
            return []
        return self._orphans.release(_nqns_of(ref for ref, _ in claimed), only=self._orphans.unreleased)

    def orphan_stats(self) -> OrphanStats:
        """Subsystems left connected after a failed release, and releases that failed since start."""
        return self._orphans.stats()

    def head_of(self, ref: VolumeRef) -> str | None:
        """The volume's head disk found by its namespace UUID alone (its read-write or read-only namespace)."""
        found = (self._sysfs.find_namespace(u) for u in (ref.uuid, readonly_namespace_uuid(ref.uuid)))
        return next((ns.device for ns in found if ns is not None), None)

    def release_volume(self, ref: VolumeRef, in_use: frozenset[VolumeRef]) -> list[str]:
        """Disconnect the volume's subsystems by its ID (no context: its staging record was set aside), as an
        orphan is: never one whose device is in use, nor one another staged volume (``in_use``) shares."""
        return self._orphans.release(_nqns_of(in_use), only=_nqns_of([ref]))

    def condition(self, ref: VolumeRef, context: Mapping[str, str]) -> Condition:
        ctx = _context(ref, context)
        return paths_condition(self._sysfs.subsystem(ctx.nqn), ctx)
