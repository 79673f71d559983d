"""Per-pod I/O limits of published volumes, enforced through the pods' cgroup v2 ``io.max``.

A volume's limits come from its volume context (StorageClass keys, ``nvmeof_csi.nvmeof.qos``) unless a newer
set was read from the volume's agent (a live change through ControllerModifyVolume, fetched by the node's
reconcile loop through a :data:`LimitsSource`) and saved in :class:`LimitOverrides` (one small file per
volume next to, not inside, the staging records: the loop never rewrites a record an RPC may be saving).
Each published target path remembers the pod that asked for it (``csi.storage.k8s.io/pod.uid``); the line is
written for the volume's native-multipath head disk, never a hidden per-path device.

Contract:
- :meth:`QosEnforcer.apply` waits up to ``wait`` seconds for the pod's cgroup (kubelet normally creates it
  before mounting, but not provably) and writes the line; it never fails a publish: what could not be done
  is returned as the reason, and :meth:`QosEnforcer.reconcile` finishes it later.
- :meth:`QosEnforcer.status` tells, per published pod, whether the limits in force equal the wanted ones.
- :meth:`QosEnforcer.remove` removes the pod's line for the device (a vanished pod cgroup is fine).
- :meth:`QosEnforcer.refresh` asks the source for a volume's current limits and saves a changed set; an
  unreachable source changes nothing (the limits in force stay).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.atomic import read_json, remove_durably, write_json_atomic
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.host.devices import device_number
from nvmeof_csi.nvmeof.qos import QosLimits, limits_from
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.service.records import StagingRecord

#: a staged volume's current mutable parameters as its agent holds them; None when they cannot be read now
LimitsSource = Callable[[StagingRecord], Mapping[str, str] | None]


@runtime_checkable
class PassLimits(Protocol):
    """A limits source that can answer a whole reconcile pass from one listing per agent: :meth:`for_pass`
    returns a :data:`LimitsSource` valid for one pass (its answers as of the pass's start)."""

    def for_pass(self) -> LimitsSource: ...


log = logging.getLogger(__name__)


class LimitOverrides:
    """Live-changed limits per staged volume: ``<root>/<location>.<uuid>.json`` (atomic writes)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, ref: VolumeRef) -> Path:
        return self._root / f"{ref.location}.{ref.uuid}.json"

    def get(self, ref: VolumeRef) -> dict[str, str] | None:
        try:
            doc = read_json(self._path(ref))
        except ValueError:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("limits"), dict):
            return None
        return {str(k): str(v) for k, v in doc["limits"].items()}

    def put(self, ref: VolumeRef, limits: Mapping[str, str]) -> None:
        write_json_atomic(self._path(ref), {"limits": dict(limits)})

    def remove(self, ref: VolumeRef) -> None:
        remove_durably(self._path(ref))


def wanted_limits(record: StagingRecord, overrides: LimitOverrides | None = None) -> QosLimits:
    """The limits of a staged volume: the live-changed set saved for it, else its volume context's."""
    changed = overrides.get(record.ref) if overrides is not None else None
    return limits_from(changed if changed is not None else record.context)


@dataclass(frozen=True)
class PodLimit:
    """One published pod of a volume: whether its ``io.max`` line holds the wanted limits, and why not."""

    volume_id: str
    pod_uid: str
    enforced: bool
    reason: str = ""


class QosEnforcer:
    def __init__(
        self,
        cgroups: PodCgroups,
        overrides: LimitOverrides | None = None,
        device_number: Callable[[str], str] = device_number,
        wait: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._cgroups = cgroups
        self.overrides = overrides
        self._number = device_number
        self._wait = wait
        self._sleep = sleep

    def wanted(self, record: StagingRecord) -> QosLimits:
        return wanted_limits(record, self.overrides)

    def refresh(self, record: StagingRecord, source: LimitsSource) -> list[str]:
        """Fetch the volume's current limits; save them when they changed. Returns what changed."""
        try:
            fresh = source(record)
        except (DriverError, OSError) as exc:
            log.debug("volume %s: current limits not readable now: %s", record.volume_id, exc)
            return []
        if fresh is None or self.overrides is None:
            return []
        try:
            changed = limits_from(fresh)
        except DriverError as exc:
            log.warning("volume %s: the agent holds invalid limits %s: %s", record.volume_id, dict(fresh), exc)
            return []
        if changed == self.wanted(record):
            return []
        self.overrides.put(record.ref, changed.to_context())
        return [f"{record.volume_id}: limits changed to {changed.io_max_fields()}"]

    def forget(self, ref: VolumeRef) -> None:
        if self.overrides is not None:
            self.overrides.remove(ref)

    def apply(self, record: StagingRecord, pod_uid: str, device: str, wait: bool = True) -> str:
        """Write the pod's line for ``device``; returns '' when in force, else why not (never raises)."""
        limits = self.wanted(record)
        try:
            available, why = self._cgroups.io_controller()
            if not available:
                return why if limits.limited else ""
            cgroup = self._cgroups.find(pod_uid)
            deadline = time.monotonic() + (self._wait if wait else 0)
            while cgroup is None and time.monotonic() < deadline:
                self._sleep(0.1)
                cgroup = self._cgroups.find(pod_uid)
            if cgroup is None:
                return f"the cgroup of pod {pod_uid} does not exist (yet)" if limits.limited else ""
            number = self._number(device)
            if self._line_matches(cgroup, number, limits):
                return ""
            self._cgroups.set_io_max(cgroup, limits.io_max_line(number))
            log.info("volume %s: io.max of pod %s set to %s", record.volume_id, pod_uid, limits.io_max_line(number))
            return ""
        except (DriverError, OSError) as exc:
            log.warning("volume %s: limits of pod %s not applied: %s", record.volume_id, pod_uid, exc)
            return str(exc)

    def _line_matches(self, cgroup: Path, number: str, limits: QosLimits) -> bool:
        current = self._cgroups.io_max(cgroup).get(number)
        if current is None:
            return not limits.limited
        return current == limits.io_max_fields()

    def remove(self, volume_id: str, pod_uid: str, device: str) -> None:
        try:
            cgroup = self._cgroups.find(pod_uid)
            if cgroup is not None and device:
                self._cgroups.clear_io_max(cgroup, self._number(device))
        except (DriverError, OSError) as exc:
            log.warning("volume %s: io.max line of pod %s not removed: %s", volume_id, pod_uid, exc)

    def status(self, record: StagingRecord) -> list[PodLimit]:
        """Per published pod of ``record``: are the wanted limits in force? (Unlimited: in force when the pod has
        no line for the device, so a limit that was lifted is removed by the reconcile pass.)"""
        limits = self.wanted(record)
        return [
            PodLimit(record.volume_id, pod, *self._check(record, pod, limits))
            for pod in sorted(set(record.pods.values()))
        ]

    def _check(self, record: StagingRecord, pod_uid: str, limits: QosLimits) -> tuple[bool, str]:
        available, why = self._cgroups.io_controller()
        if not available:
            return not limits.limited, why
        cgroup = self._cgroups.find(pod_uid)
        if cgroup is None:  # not there yet, or the pod is gone (and its limits with it)
            return not limits.limited, f"the cgroup of pod {pod_uid} does not exist"
        if not record.device:
            return not limits.limited, "the volume's device is not known yet"
        try:
            if self._line_matches(cgroup, self._number(record.device), limits):
                return True, ""
        except OSError as exc:
            return False, str(exc)
        return False, "io.max does not hold the volume's limits"

    def reconcile(self, records: Iterable[StagingRecord]) -> list[str]:
        """Rewrite every published pod's line whose limits are not in force; returns what was changed."""
        actions = []
        for record in records:
            for pod in self.status(record):
                if pod.enforced or not record.device:
                    continue
                why = self.apply(record, pod.pod_uid, record.device, wait=False)
                if not why:
                    actions.append(f"{record.volume_id}: limits of pod {pod.pod_uid} re-applied")
        return actions


def pod_uid_of(volume_context: Mapping[str, str]) -> str:
    """The pod UID kubelet passes at NodePublishVolume (``podInfoOnMount``); '' when absent."""
    return volume_context.get("csi.storage.k8s.io/pod.uid", "")
