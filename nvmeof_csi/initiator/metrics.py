"""Per-volume metrics of the volumes staged on this node, read from sysfs at scrape time (nothing is kept):

| metric | labels | meaning |
|---|---|---|
| ``nvmeof_csi_volume_paths`` | volume_id, state | paths (controllers) of the volume by state (live, connecting) |
| ``nvmeof_csi_volume_paths_expected`` | volume_id | portals the volume has |
| ``nvmeof_csi_volume_path_ana_state`` | volume_id, path, ana_state | 1 for each path's current ANA state |
| ``nvmeof_csi_volume_{reads,writes}_total`` | volume_id | I/Os completed on the native-multipath head disk |
| ``nvmeof_csi_volume_{read,written}_bytes_total`` | volume_id | bytes moved |
| ``nvmeof_csi_volume_{read,write}_seconds_total`` | volume_id | time spent on them (latency = seconds / I/Os) |
| ``nvmeof_csi_volume_qos_limit`` | volume_id, kind | per-pod limit (read_iops, write_iops, read_bps, write_bps) |
| ``nvmeof_csi_volume_qos_enforced`` | volume_id (+ pod_uid: ``--metrics-pod-uid``) | 1 when the limits hold |

``nvmeof_csi_volume_paths{state="live"}`` is always present (0 when no path is live). Label sets are bounded by
the volumes staged here times their paths (or published pods). Contract: collecting never raises (a
volume whose sysfs entries vanish mid-scrape is skipped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.nvmeof.context import VolumeContext
from nvmeof_csi.nvmeof.qos import QOS_KEYS
from nvmeof_csi.service.contracts import OrphanStats
from nvmeof_csi.service.qos import QosEnforcer
from nvmeof_csi.service.records import StagingRecord

log = logging.getLogger(__name__)
SECTOR = 512


def disk_stat(sys_root: Path, disk: str) -> list[int] | None:
    """The fields of ``/sys/block/<disk>/stat`` (reads, read merges, sectors read, ms reading, writes, ...)."""
    try:
        return [int(x) for x in (sys_root / "block" / disk / "stat").read_text().split()]
    except (OSError, ValueError):
        return None


class NodeVolumeCollector(Collector):
    def __init__(
        self,
        records: Callable[[], Sequence[StagingRecord]],
        sysfs: NvmeSysfs,
        qos: QosEnforcer | None = None,
        pod_uid: bool = False,
        orphans: Callable[[], OrphanStats] | None = None,
    ) -> None:
        """``pod_uid``: label ``nvmeof_csi_volume_qos_enforced`` by pod (which pods run where is not every
        scraper's business, so it is off unless asked for). ``orphans``: the connector's unreleased subsystems."""
        self._orphans = orphans
        self._records = records
        self._sysfs = sysfs
        self._enforcer = qos
        self._pod_uid = pod_uid

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        paths = GaugeMetricFamily(
            "nvmeof_csi_volume_paths", "Paths of a staged volume by controller state.", labels=["volume_id", "state"]
        )
        expected = GaugeMetricFamily(
            "nvmeof_csi_volume_paths_expected", "Portals of a staged volume.", labels=["volume_id"]
        )
        ana = GaugeMetricFamily(
            "nvmeof_csi_volume_path_ana_state",
            "1 for the current ANA state of each path.",
            labels=["volume_id", "path", "ana_state"],
        )
        counters = {
            name: CounterMetricFamily(f"nvmeof_csi_volume_{name}", help_, labels=["volume_id"])
            for name, help_ in (
                ("reads", "Reads completed on the volume's head disk."),
                ("writes", "Writes completed on the volume's head disk."),
                ("read_bytes", "Bytes read from the volume's head disk."),
                ("written_bytes", "Bytes written to the volume's head disk."),
                ("read_seconds", "Time spent reading (head disk)."),
                ("write_seconds", "Time spent writing (head disk)."),
            )
        }
        limit = GaugeMetricFamily(
            "nvmeof_csi_volume_qos_limit", "Per-pod I/O limit of a staged volume.", labels=["volume_id", "kind"]
        )
        enforced = GaugeMetricFamily(
            "nvmeof_csi_volume_qos_enforced",
            "1 when the published pods' io.max holds the volume's limits.",
            labels=["volume_id", "pod_uid"] if self._pod_uid else ["volume_id"],
        )
        try:
            records = list(self._records())
        except Exception:
            log.exception("metrics: cannot read staging records")
            records = []
        for record in records:  # paths and limits apart: a volume whose paths cannot be read still reports limits
            try:
                self._one(record, paths, expected, ana, counters)
            except Exception:
                log.debug("metrics: paths of volume %s skipped", record.volume_id, exc_info=True)
            try:
                self._qos(record, limit, enforced)
            except Exception:
                log.debug("metrics: limits of volume %s skipped", record.volume_id, exc_info=True)
        if self._orphans is not None:
            stats = self._orphans()
            yield GaugeMetricFamily(
                "nvmeof_csi_node_unreleased_subsystems",
                "The driver's subsystems no staged volume claims, still connected because their release failed.",
                value=stats.unreleased,
            )
            yield CounterMetricFamily(
                "nvmeof_csi_node_orphan_release_failures",
                "Releases of unclaimed subsystems that failed since the node plugin started (retried each pass).",
                value=stats.failures,
            )
        yield limit
        yield enforced
        yield paths
        yield expected
        yield ana
        yield from counters.values()

    def _one(
        self,
        record: StagingRecord,
        paths: GaugeMetricFamily,
        expected: GaugeMetricFamily,
        ana: GaugeMetricFamily,
        counters: dict[str, CounterMetricFamily],
    ) -> None:
        vid = record.volume_id
        ctx = VolumeContext.from_dict(record.context)
        expected.add_metric([vid], len(ctx.portals))
        sub = self._sysfs.subsystem(ctx.nqn)
        if sub is None:
            paths.add_metric([vid, "live"], 0)
            return
        states: dict[str, int] = {"live": 0}
        for ctrl in sub.controllers:
            states[ctrl.state] = states.get(ctrl.state, 0) + 1
        for state, count in sorted(states.items()):
            paths.add_metric([vid, state], count)
        portal_of = {c.name: c.portal for c in sub.controllers}
        ns = next((n for n in sub.namespaces if n.uuid.lower() == ctx.namespace_uuid.lower()), None)
        if ns is None:
            return
        for path in ns.paths:
            ana.add_metric([vid, portal_of.get(path.controller, path.controller), path.ana_state], 1)
        stat = disk_stat(self._sysfs.root, ns.name)
        if stat is None or len(stat) < 8:
            return
        values = {
            "reads": stat[0],
            "read_bytes": stat[2] * SECTOR,
            "read_seconds": stat[3] / 1000,
            "writes": stat[4],
            "written_bytes": stat[6] * SECTOR,
            "write_seconds": stat[7] / 1000,
        }
        for name, value in values.items():
            counters[name].add_metric([vid], value)

    def _qos(self, record: StagingRecord, limit: GaugeMetricFamily, enforced: GaugeMetricFamily) -> None:
        if self._enforcer is None:
            return
        wanted = self._enforcer.wanted(record)
        for key in QOS_KEYS:
            value = wanted.get(key.key)
            if value is not None:
                limit.add_metric([record.volume_id, key.kind], value)
        if wanted.limited:
            pods = self._enforcer.status(record)
            if self._pod_uid:
                for pod in pods:
                    enforced.add_metric([record.volume_id, pod.pod_uid], 1 if pod.enforced else 0)
            elif pods:
                enforced.add_metric([record.volume_id], 1 if all(p.enforced for p in pods) else 0)
