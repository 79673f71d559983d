"""The node's ``Connector`` over the kernel NVMe-oF initiator (nvme-tcp, nvme-rdma, native multipath).

Contract (in addition to ``service/ports.py``):
- ``connect`` makes one controller per portal of the volume context (TCP or RDMA) with bounded tunables
  (StorageClass values override the defaults), using this node's host NQN and host ID; portals that already
  have a controller are left alone ("already connected" is success). It succeeds when at least one path is up
  and the namespace with the volume's UUID appears (found in sysfs, bounded by the caller's timeout); then it
  returns the native-multipath head device. A multi-portal volume with native multipath off is refused with
  FAILED_PRECONDITION unless single-path staging is allowed (then only the first portal is used).
- ``disconnect`` removes the controllers of the volume's subsystem (whole-NQN match, so ``vol1`` never
  touches ``vol10``), unless another staged volume still uses that subsystem. Controllers we did not make
  (other NQNs) are never touched.
- ``condition`` is abnormal when a path is not live, naming the paths ("1 of 2 paths live: tcp:...:4421 connecting").
Commands are argv lists with timeouts; kernel state is read from sysfs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi import NQN_PREFIX
from nvmeof_csi.errors import (
    CommandError,
    DeadlineExceeded,
    DriverError,
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
)
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.initiator.identity import HostIdentity
from nvmeof_csi.initiator.sysfs import NvmeSysfs, Subsystem
from nvmeof_csi.initiator.uevents import EventWait, PollingWait
from nvmeof_csi.service.ports import Condition, Health, VolumeRef

log = logging.getLogger(__name__)
CONNECT_TIMEOUT = 60.0
#: Bounded defaults: a lost target is retried for 10 minutes (never forever: a reboot must not hang), I/O is
#: queued meanwhile (fast_io_fail off), keep-alive notices a dead link within 5 s.
DEFAULTS = {"ctrlLossTmo": "600", "reconnectDelay": "2", "keepAliveTmo": "5"}
FLAGS = {
    "ctrlLossTmo": "--ctrl-loss-tmo", "reconnectDelay": "--reconnect-delay", "keepAliveTmo": "--keep-alive-tmo",
    "nrIoQueues": "--nr-io-queues", "queueSize": "--queue-size", "tos": "--tos",
}


@dataclass(frozen=True)
class Portal:
    trtype: str
    traddr: str
    trsvcid: str

    @property
    def key(self) -> str:
        return f"{self.trtype}:{self.traddr}:{self.trsvcid}"


def parse_portals(text: str) -> list[Portal]:
    """``tcp:10.0.0.5:4420,rdma:10.0.2.5:4420`` (IPv6 in brackets) -> portals."""
    portals = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        trtype, _, rest = item.partition(":")
        if rest.startswith("["):
            addr, _, port = rest[1:].partition("]:")
        else:
            addr, _, port = rest.rpartition(":")
        if trtype not in ("tcp", "rdma") or not addr or not port.isdigit():
            raise InvalidArgument(f"volume context portal {item!r} is not TRTYPE:TRADDR:TRSVCID")
        portals.append(Portal(trtype, addr, port))
    return portals


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
    ) -> None:
        self._exec = executor
        self._sysfs = sysfs
        self._identity = identity
        self._single_path = allow_single_path
        self._sleep = sleep
        self._clock = clock
        self._events = block_events or self._polling

    @contextmanager
    def _polling(self) -> Iterator[EventWait]:
        yield PollingWait(self._sleep, 0.1)

    def health(self) -> Health:
        if not (self._sysfs.root / "class" / "nvme-fabrics").exists() and not Path("/dev/nvme-fabrics").exists():
            return Health(False, "nvme-fabrics is not loaded (modprobe nvme-tcp / nvme-rdma)")
        if self._sysfs.multipath_enabled() is False and not self._single_path:
            return Health(False, "native NVMe multipath is off (nvme_core.multipath=N)")
        return Health(True, f"initiator ready as {self._identity.nqn}")

    @staticmethod
    def _nqn(ref: VolumeRef, context: Mapping[str, str]) -> str:
        nqn = context.get("nqn", "")
        if not nqn:
            raise FailedPrecondition(f"volume {ref.uuid}: volume context has no 'nqn' (not an NVMe-oF volume)")
        return nqn

    def _portals(self, ref: VolumeRef, context: Mapping[str, str]) -> list[Portal]:
        portals = parse_portals(context.get("portals", ""))
        if not portals:
            raise FailedPrecondition(f"volume {ref.uuid}: volume context lists no portals")
        if len(portals) > 1 and self._sysfs.multipath_enabled() is False:
            if not self._single_path:
                raise FailedPrecondition(
                    f"volume {ref.uuid} has {len(portals)} portals but native NVMe multipath is off "
                    "(nvme_core.multipath=N); enable it, or allow single-path staging"
                )
            portals = portals[:1]
        return portals

    def _connect_argv(self, portal: Portal, nqn: str, context: Mapping[str, str]) -> list[str]:
        argv = ["nvme", "connect", "-t", portal.trtype, "-a", portal.traddr, "-s", portal.trsvcid, "-n", nqn,
                f"--hostnqn={self._identity.nqn}", f"--hostid={self._identity.host_id}"]
        for key, flag in FLAGS.items():
            value = context.get(key) or DEFAULTS.get(key)
            if value:
                argv.append(f"{flag}={value}")
        return argv

    def connect(self, ref: VolumeRef, context: Mapping[str, str], timeout: float) -> str:
        deadline = self._clock() + timeout
        nqn, ns_uuid = self._nqn(ref, context), context.get("namespaceUUID", "")
        portals = self._portals(ref, context)
        with self._events() as events:  # listening before connecting: no uevent can slip past
            sub = self._sysfs.subsystem(nqn)
            have = {c.portal for c in sub.controllers} if sub else set()
            errors = []
            for portal in portals:
                if portal.key in have:
                    continue
                left = deadline - self._clock()
                if left <= 0:
                    break
                try:
                    self._exec.run(self._connect_argv(portal, nqn, context), timeout=min(CONNECT_TIMEOUT, left))
                except CommandError as err:
                    if "already connected" in (err.err + err.out).lower():
                        continue
                    errors.append(f"{portal.key}: {err.err.strip() or err}")
                    log.warning("volume %s: connect %s failed: %s", ref.uuid, portal.key, err)
            self._apply_sysfs_tunables(nqn, context)
            log.debug("volume %s: waiting for namespace %s (%s)", ref.uuid, ns_uuid, events.source)
            return self._wait_for_namespace(ref, nqn, ns_uuid, deadline, errors, events)

    def _apply_sysfs_tunables(self, nqn: str, context: Mapping[str, str]) -> None:
        value = context.get("fastIoFailTmo")
        sub = self._sysfs.subsystem(nqn)
        if not value or sub is None:
            return
        for ctrl in sub.controllers:
            attr = self._sysfs.root / "class" / "nvme" / ctrl.name / "fast_io_fail_tmo"
            try:
                attr.write_text(value)
            except OSError as exc:
                log.warning("cannot set fast_io_fail_tmo on %s: %s", ctrl.name, exc)

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
        ns_uuid = context.get("namespaceUUID", "")
        ns = self._sysfs.find_namespace(ns_uuid) if ns_uuid else None
        return ns.device if ns is not None else None

    def disconnect(self, ref: VolumeRef, context: Mapping[str, str], in_use: frozenset[VolumeRef]) -> None:
        nqn = self._nqn(ref, context)
        if any(NQN_PREFIX + other.uuid == nqn for other in in_use if other != ref):
            log.info("volume %s: subsystem %s still used by another staged volume; kept", ref.uuid, nqn)
            return
        sub = self._sysfs.subsystem(nqn)
        for ctrl in sub.controllers if sub else ():
            try:
                self._exec.run(["nvme", "disconnect", "-d", ctrl.name], timeout=CONNECT_TIMEOUT)
            except CommandError:
                still = self._sysfs.subsystem(nqn)
                if still is not None and any(c.name == ctrl.name for c in still.controllers):
                    raise
                log.info("controller %s was already gone", ctrl.name)

    def refresh_size(self, ref: VolumeRef, context: Mapping[str, str], device: str) -> int:
        sub = self._sysfs.subsystem(self._nqn(ref, context))
        if sub is not None:
            self._rescan(sub)
        ns_uuid = context.get("namespaceUUID", "")
        sizes = []
        for _ in range(50):  # the new size shows up after the rescan completes
            ns = self._sysfs.find_namespace(ns_uuid)
            sizes.append(ns.size_bytes if ns else 0)
            if len(sizes) >= 3 and sizes[-1] == sizes[-2] == sizes[-3]:
                break
            self._sleep(0.1)
        return sizes[-1]

    def reconcile(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]], timeout: float) -> list[str]:
        actions = []
        claimed_nqns = set()
        for ref, context in claimed:
            nqn = self._nqn(ref, context)
            claimed_nqns.add(nqn)
            before = self._sysfs.subsystem(nqn)
            have = {c.portal for c in before.controllers} if before else set()
            missing = [p.key for p in parse_portals(context.get("portals", "")) if p.key not in have]
            if not missing:
                continue
            try:
                self.connect(ref, context, timeout)
                actions.append(f"volume {ref.uuid}: reconnected {', '.join(missing)}")
            except DriverError as err:
                actions.append(f"volume {ref.uuid}: could not reconnect {', '.join(missing)}: {err}")
        for sub in self._sysfs.subsystems():
            if sub.nqn.startswith(NQN_PREFIX) and sub.nqn not in claimed_nqns:
                for ctrl in sub.controllers:
                    self._exec.run(["nvme", "disconnect", "-d", ctrl.name], timeout=CONNECT_TIMEOUT)
                actions.append(f"disconnected {sub.nqn}: no staged volume claims it")
        return actions

    def condition(self, ref: VolumeRef, context: Mapping[str, str]) -> Condition:
        nqn = self._nqn(ref, context)
        sub = self._sysfs.subsystem(nqn)
        wanted = {p.key for p in parse_portals(context.get("portals", ""))}
        if sub is None:
            return Condition(True, f"not connected to {nqn}")
        states = {c.portal: c.state for c in sub.controllers}
        missing = sorted(wanted - set(states))
        bad = sorted(f"{p} {s}" for p, s in states.items() if s != "live") + [f"{p} not connected" for p in missing]
        live = sum(1 for s in states.values() if s == "live")
        total = max(len(wanted), len(states))
        if bad:
            return Condition(True, f"{live} of {total} paths live: {', '.join(bad)}")
        return Condition(False, f"{live} of {total} paths live")


def rdma_capable(sys_root: Path = Path("/sys")) -> bool:
    """True when the node has an RDMA device (``/sys/class/infiniband`` is not empty)."""
    folder = sys_root / "class" / "infiniband"
    try:
        return any(folder.iterdir())
    except OSError:
        return False

