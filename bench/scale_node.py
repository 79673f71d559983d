"""Benchmark: how the node plugin's cost grows with the volumes it has published. The node's own services (the
real staging service, mounter, filesystems and QoS enforcer) on this host, with the loop backend in place of
NVMe-oF (real loop devices, ext4, mounts, bind mounts: the kernel's NVMe side is not the point here; the lab
measures stage against other NVMe controllers) and a cgroup tree in a plain folder (one pod per volume, each
with its ``io.max`` line). The limits source answers a pass from one listing, as the agents' does.

At each level (10 and 200 published volumes by default) it measures one reconcile pass (the node's periodic
QoS pass over every published volume: median of several), NodeGetVolumeStats of one volume, NodeStage +
NodePublish of one more volume (its creation not counted) and its NodeUnpublish + NodeUnstage; the RSS; and
one read of the kernel's mount table (``/proc/self/mountinfo``), which every unmount reads once and which grows
with every mount: the floor under the teardown's growth. Writes
``results/bench-scale-node.json``. Needs root and /dev/loop-control.

usage: python -m bench.scale_node [--levels 10 200] [--samples 25] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.results import save
from bench.scale_agent import quantile, timed
from nvmeof_csi.backends.loop import LoopTargetBackend
from nvmeof_csi.backends.loop_connector import LoopConnector
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.service.contracts import Volume
from nvmeof_csi.service.qos import LimitOverrides, LimitsSource, QosEnforcer
from nvmeof_csi.service.records import AccessSpec, StagingRecord, StagingStore
from nvmeof_csi.service.staging import StagingService

MiB = 1 << 20
ACCESS = AccessSpec(block=False, fs_type="ext4")
LIMITS = {"readIops": "300", "writeBps": "4194304"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, nargs="+", default=[10, 200], help="published volumes")
    ap.add_argument("--samples", type=int, default=25, help="passes, stats calls and stages measured per level")
    ap.add_argument("--smoke", action="store_true", help="CI: levels 2 and 6, 3 samples; not a measurement")
    return ap


class OneListing:
    """Limits as the agents hold them, one listing per pass (``service.qos.PassLimits``)."""

    def __call__(self, record: StagingRecord) -> Mapping[str, str] | None:
        return LIMITS

    def for_pass(self) -> LimitsSource:
        return self


@dataclass
class Node:
    work: Path
    backend: LoopTargetBackend
    svc: StagingService
    cgroups: PodCgroups
    published: list[tuple[Volume, str, str]] = field(default_factory=list)  # (volume, staging, target)

    def bring_up(self, tag: str, timed_ms: list[float] | None = None) -> tuple[Volume, str, str]:
        """Create, stage and publish one volume for a pod of its own (its cgroup made first); with ``timed_ms``,
        the milliseconds of NodeStage + NodePublish alone are appended to it."""
        vol = self.backend.create_volume(tag, 16 * MiB, dict(LIMITS))
        pod = str(uuid.uuid4())
        folder = self.cgroups.root / "kubepods" / f"pod{pod}"
        folder.mkdir(parents=True)
        (folder / "io.max").write_text("")
        (folder / "cgroup.procs").write_text("")
        staging, target = str(self.work / "staging" / tag), str(self.work / "pods" / tag / "mount")
        began = time.perf_counter()
        self.svc.stage(f"nvmeof-v1.loop.{vol.ref.uuid}", vol.ref, staging, ACCESS, vol.context, 60)
        self.svc.publish(vol.ref, staging, target, ACCESS, False, pod)
        if timed_ms is not None:
            timed_ms.append((time.perf_counter() - began) * 1000)
        return vol, staging, target

    def take_down(self, vol: Volume, staging: str, target: str, timed_ms: list[float] | None = None) -> None:
        """NodeUnpublish, NodeUnstage, delete; with ``timed_ms`` the first two's milliseconds are appended."""
        began = time.perf_counter()
        self.svc.unpublish(vol.ref, target)
        self.svc.unstage(vol.ref, staging)
        if timed_ms is not None:
            timed_ms.append((time.perf_counter() - began) * 1000)
        self.backend.delete_volume(vol.ref)


@contextmanager
def node() -> Iterator[Node]:
    ex = SubprocessExecutor()
    with tempfile.TemporaryDirectory(prefix="bench-scale-node-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        cgroups = PodCgroups(work / "cg")
        cgroups.root.mkdir()
        (cgroups.root / "cgroup.controllers").write_text("cpu io memory\n")
        qos = QosEnforcer(cgroups, LimitOverrides(work / "qos"), wait=0.0)
        svc = StagingService(
            LoopConnector(ex), Mounter(ex), Filesystems(ex), StagingStore(work / "records"), root=work, qos=qos,
            limits_source=OneListing(),
        )  # fmt: skip
        it = Node(work, LoopTargetBackend(work / "vols", 1 << 40, {}), svc, cgroups)
        try:
            yield it
        finally:
            for published in reversed(it.published):
                try:
                    it.take_down(*published)
                except Exception as err:  # clean up as much as can be, report the rest
                    print(f"bench scale-node: clean-up of {published[0].name} failed: {err}", flush=True)


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def median_ms(call: Callable[[], Any], samples: int) -> float:
    return round(statistics.median(timed(call) for _ in range(samples)), 2)


def measure(it: Node, level: int, samples: int) -> dict[str, Any]:
    it.svc.reconcile_limits()  # a first pass puts every line in force
    pass_ms = median_ms(it.svc.reconcile_limits, samples)
    some = it.published[len(it.published) // 2]
    stats_ms = median_ms(lambda: it.svc.stats(some[0].ref, some[2]), samples * 3)
    table_ms = median_ms(lambda: Path("/proc/self/mountinfo").read_text(), samples * 5)  # the kernel's part
    stages: list[float] = []
    downs: list[float] = []
    for i in range(samples):
        it.take_down(*it.bring_up(f"extra-{level}-{i}", stages), timed_ms=downs)
    return {
        "volumes": level,
        "pass_ms": pass_ms,
        "pass_ms_per_volume": round(pass_ms / level, 3),
        "stats_ms": stats_ms,
        "stage_publish_p50_ms": quantile(stages, 0.5),
        "unpublish_unstage_p50_ms": quantile(downs, 0.5),
        "mount_table_read_ms": table_ms,
        "rss_kib": rss_kib(),
    }


def floor(base_ms: float, base: Mapping[str, Any], top: Mapping[str, Any]) -> float:
    """The ratio an operation of ``base_ms`` at the fewest volumes would reach at the most if only its two reads
    of the mount table grew (each unmount or mount check reads it once; nothing cheaper tells what is mounted)."""
    growth = 2 * (float(top["mount_table_read_ms"]) - float(base["mount_table_read_ms"]))
    return round((base_ms + growth) / base_ms, 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels, samples = ([2, 6], 3) if args.smoke else (sorted(args.levels), args.samples)
    rows = []
    with node() as it:
        for level in levels:
            while len(it.published) < level:
                it.published.append(it.bring_up(f"v{len(it.published)}"))
            os.sync()  # the fill's writeback (mkfs on every new volume) is not the measured calls' cost
            rows.append(measure(it, level, samples))
            print(f"bench scale-node: {rows[-1]}", flush=True)
    base, top = rows[0], rows[-1]
    return {
        "smoke": args.smoke,
        "samples": samples,
        "levels": rows,
        "pass_per_volume_ratio": round(top["pass_ms_per_volume"] / base["pass_ms_per_volume"], 2),
        "pass_ratio": round(top["pass_ms"] / base["pass_ms"], 2),
        "stats_ratio": round(top["stats_ms"] / base["stats_ms"], 2),
        "stage_ratio": round(top["stage_publish_p50_ms"] / base["stage_publish_p50_ms"], 2),
        "unstage_ratio": round(top["unpublish_unstage_p50_ms"] / base["unpublish_unstage_p50_ms"], 2),
        # each way reads the kernel's mount table twice (is it mounted there?): that growth alone, as a ratio
        "table_floor_stage_ratio": floor(base["stage_publish_p50_ms"], base, top),
        "table_floor_unstage_ratio": floor(base["unpublish_unstage_p50_ms"], base, top),
    }


def run_and_report(args: argparse.Namespace) -> None:
    result = run(args)
    save("scale-node", result)
    base, top = result["levels"][0], result["levels"][-1]
    print(
        f"bench scale-node: {top['volumes']} published vs {base['volumes']}: a reconcile pass {top['pass_ms']} vs "
        f"{base['pass_ms']} ms ({result['pass_per_volume_ratio']}x per volume), NodeGetVolumeStats "
        f"{result['stats_ratio']}x, stage+publish {result['stage_ratio']}x, unpublish+unstage "
        f"{result['unstage_ratio']}x (goals 1.2x; the mount table's own growth alone: "
        f"{result['table_floor_stage_ratio']}x, {result['table_floor_unstage_ratio']}x); RSS {top['rss_kib']} KiB"
    )


def main() -> None:
    run_and_report(parser().parse_args())


if __name__ == "__main__":
    main()
