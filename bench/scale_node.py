"""Benchmark: how the node plugin's cost grows with the volumes it has published. The node's own services (the
real staging service, mounter, filesystems and QoS enforcer) on this host, with the loop backend in place of
NVMe-oF (real loop devices, ext4, mounts, bind mounts: the kernel's NVMe side is not the point here; the lab
measures stage against other NVMe controllers) and a cgroup tree in a plain folder (one pod per volume, each
with its ``io.max`` line). The limits source answers a pass from one listing, as the agents' does.

At each level (10 and 200 published volumes by default) it measures one reconcile pass (the node's periodic
QoS pass over every published volume: median of several), NodeGetVolumeStats of one volume, NodeStage +
NodePublish of one more volume (its creation not counted) and its NodeUnpublish + NodeUnstage, each split by
part (``bench/scale_node_parts.py``: each program the node runs, each read of the kernel's mount table, and the
node plugin's own Python); the RSS; and one read of the kernel's mount table (``/proc/self/mountinfo``), which
grows with every mount. The levels are visited in alternating rounds (10, 200, 200, 10, 10, 200...: the node
filled and emptied between them) and each level's samples pooled over its visits, so the host's drift (its
writeback, other work) falls on both sizes alike. A stage or teardown's growth is then told apart: what the
programs and the table reads added (the kernel's and util-linux's part: ``floor_ratio``) and what the node's own
part did (``own_ratio``). Writes ``results/bench-scale-node.json``. Needs root and /dev/loop-control.

usage: python -m bench.scale_node [--levels 10 200] [--samples 24] [--rounds 4] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.results import save
from bench.scale_agent import quantile, timed
from bench.scale_node_parts import Parts, TimedExecutor, TimedLoopConnector, TimedStore, growth, medians, timed_table
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.loop.backend import LoopTargetBackend
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import Volume
from nvmeof_csi.service.qos import LimitOverrides, LimitsSource, QosEnforcer
from nvmeof_csi.service.records import AccessSpec, StagingRecord
from nvmeof_csi.service.staging import StagingService

MiB = 1 << 20
ACCESS = AccessSpec(block=False, fs_type="ext4")
LIMITS = {"readIops": "300", "writeBps": "4194304"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, nargs="+", default=[10, 200], help="published volumes")
    ap.add_argument("--samples", type=int, default=24, help="passes, stats calls and stages measured per level")
    ap.add_argument("--rounds", type=int, default=4, help="visits to each level, alternating; samples split over them")
    ap.add_argument("--smoke", action="store_true", help="CI: levels 2 and 6, 3 samples, 1 round; not a measurement")
    return ap


class OneListing:
    """Limits as the agents hold them, one listing per pass (``service.qos.PassLimits``)."""

    def __call__(self, record: StagingRecord) -> Mapping[str, str] | None:
        return LIMITS

    def for_pass(self) -> LimitsSource:
        return self


Published = tuple[Volume, str, str]  # (volume, staging, target)


@dataclass
class Node:
    work: Path
    backend: LoopTargetBackend
    svc: StagingService
    cgroups: PodCgroups
    parts: Parts
    published: list[Published] = field(default_factory=list)

    def bring_up(self, tag: str, cycles: list[dict[str, float]] | None = None) -> Published:
        """Create, stage and publish one volume for a pod of its own (its cgroup made first); with ``cycles``,
        NodeStage + NodePublish alone, split by part, is appended to it."""
        vol = self.backend.create_volume(tag, 16 * MiB, VolumeParameters.parse(dict(LIMITS)))
        pod = str(uuid.uuid4())
        folder = self.cgroups.root / "kubepods" / f"pod{pod}"
        folder.mkdir(parents=True)
        (folder / "io.max").write_text("")
        (folder / "cgroup.procs").write_text("")
        staging, target = str(self.work / "staging" / tag), str(self.work / "pods" / tag / "mount")

        def up() -> None:
            self.svc.stage(f"nvmeof-v1.loop.{vol.ref.uuid}", vol.ref, staging, ACCESS, vol.context, 60)
            self.svc.publish(vol.ref, staging, target, ACCESS, False, pod)

        if cycles is None:
            up()
        else:
            cycles.append(self.parts.cycle(up))
        return vol, staging, target

    def take_down(self, vol: Volume, staging: str, target: str, cycles: list[dict[str, float]] | None = None) -> None:
        """NodeUnpublish, NodeUnstage, delete; with ``cycles`` the first two, split by part, are appended."""

        def down() -> None:
            self.svc.unpublish(vol.ref, target)
            self.svc.unstage(vol.ref, staging)

        if cycles is None:
            down()
        else:
            cycles.append(self.parts.cycle(down))
        self.backend.delete_volume(vol.ref)

    def settle(self, level: int) -> None:
        """Publish or take down volumes until exactly ``level`` are published; then the writeback is flushed (a
        fill's mkfs runs are not the measured calls' cost)."""
        while len(self.published) > level:
            self.take_down(*self.published.pop())
        while len(self.published) < level:
            self.published.append(self.bring_up(f"v{uuid.uuid4().hex[:12]}"))
        os.sync()


@contextmanager
def node() -> Iterator[Node]:
    parts = Parts()
    ex = TimedExecutor(SubprocessExecutor(), parts)
    with tempfile.TemporaryDirectory(prefix="bench-scale-node-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        cgroups = PodCgroups(work / "cg")
        cgroups.root.mkdir()
        (cgroups.root / "cgroup.controllers").write_text("cpu io memory\n")
        qos = QosEnforcer(cgroups, LimitOverrides(work / "qos"), wait=0.0)
        svc = StagingService(
            TimedLoopConnector(ex, parts), Mounter(ex, timed_table(parts)), Filesystems(ex),
            TimedStore(work / "records", parts),
            root=work, qos=qos, limits_source=OneListing(),
        )  # fmt: skip
        it = Node(work, LoopTargetBackend(work / "vols", 1 << 40, {}), svc, cgroups, parts)
        try:
            yield it
        finally:
            while it.published:
                published = it.published.pop()
                try:
                    it.take_down(*published)
                except Exception as err:  # clean up as much as can be, report the rest
                    print(f"bench scale-node: clean-up of {published[0].name} failed: {err}", flush=True)


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Samples:
    """One level's samples, pooled over its visits."""

    passes: list[float] = field(default_factory=list)
    stats: list[float] = field(default_factory=list)
    table: list[float] = field(default_factory=list)
    ups: list[dict[str, float]] = field(default_factory=list)
    downs: list[dict[str, float]] = field(default_factory=list)
    rss_kib: int = 0  # at the first visit: memory a Python process took stays with it after the level shrinks


def sample(it: Node, samples: int, into: Samples) -> None:
    """One visit: ``samples`` passes, stats calls (x3), table reads (x5) and stage/teardown cycles."""
    it.svc.reconcile_limits()  # a first pass puts every line in force
    into.passes += [timed(it.svc.reconcile_limits) for _ in range(samples)]
    some = it.published[len(it.published) // 2]
    into.stats += [timed(lambda: it.svc.stats(some[0].ref, some[2])) for _ in range(samples * 3)]
    into.table += [timed(lambda: Path("/proc/self/mountinfo").read_text()) for _ in range(samples * 5)]
    for _ in range(samples):
        it.take_down(*it.bring_up(f"x{uuid.uuid4().hex[:12]}", into.ups), cycles=into.downs)
    into.rss_kib = into.rss_kib or rss_kib()


def summary(level: int, got: Samples) -> dict[str, Any]:
    pass_ms = round(statistics.median(got.passes), 2)
    ups, downs = medians(got.ups), medians(got.downs)
    return {
        "volumes": level,
        "pass_ms": pass_ms,
        "pass_ms_per_volume": round(pass_ms / level, 3),
        "stats_ms": round(statistics.median(got.stats), 2),
        "stage_publish_p50_ms": quantile([c["total"] for c in got.ups], 0.5),
        "unpublish_unstage_p50_ms": quantile([c["total"] for c in got.downs], 0.5),
        "stage_publish_parts_ms": ups,
        "unpublish_unstage_parts_ms": downs,
        "mount_table_read_ms": round(statistics.median(got.table), 2),
        "rss_kib": got.rss_kib,
    }


def visits(levels: list[int], rounds: int) -> list[int]:
    """Each round visits every level, ascending in even rounds and descending in odd ones (10, 200, 200, 10...)."""
    return [level for r in range(rounds) for level in (levels if r % 2 == 0 else levels[::-1])]


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels, samples, rounds = ([2, 6], 3, 1) if args.smoke else (sorted(args.levels), args.samples, args.rounds)
    per_visit = max(1, -(-samples // rounds))
    got = {level: Samples() for level in levels}
    with node() as it:
        for level in visits(levels, rounds):
            it.settle(level)
            sample(it, per_visit, got[level])
            print(f"bench scale-node: {level} volumes visited, {len(got[level].ups)} cycles so far", flush=True)
    rows = [summary(level, got[level]) for level in levels]
    base, top = rows[0], rows[-1]
    up = growth(base["stage_publish_parts_ms"], top["stage_publish_parts_ms"])
    down = growth(base["unpublish_unstage_parts_ms"], top["unpublish_unstage_parts_ms"])
    return {
        "smoke": args.smoke,
        "samples": per_visit * rounds,
        "rounds": rounds,
        "levels": rows,
        "pass_per_volume_ratio": round(top["pass_ms_per_volume"] / base["pass_ms_per_volume"], 2),
        "pass_ratio": round(top["pass_ms"] / base["pass_ms"], 2),
        "stats_ratio": round(top["stats_ms"] / base["stats_ms"], 2),
        "stage_ratio": round(top["stage_publish_p50_ms"] / base["stage_publish_p50_ms"], 2),
        "unstage_ratio": round(top["unpublish_unstage_p50_ms"] / base["unpublish_unstage_p50_ms"], 2),
        # the ratio each way would reach if only the programs it runs and its reads of the mount table grew
        "kernel_floor_stage_ratio": up["floor_ratio"],
        "kernel_floor_unstage_ratio": down["floor_ratio"],
        "own_stage_ratio": up["own_ratio"],
        "own_unstage_ratio": down["own_ratio"],
        "stage_ms_added": up["ms_added"],
        "unstage_ms_added": down["ms_added"],
    }


def added(parts: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {ms:+.2f}" for name, ms in parts.items() if name != "total" and abs(ms) >= 0.05)


def run_and_report(args: argparse.Namespace) -> None:
    result = run(args)
    save("scale-node", result)
    base, top = result["levels"][0], result["levels"][-1]
    print(
        f"bench scale-node: {top['volumes']} published vs {base['volumes']} ({result['rounds']} alternating rounds): "
        f"a reconcile pass {top['pass_ms']} vs {base['pass_ms']} ms ({result['pass_per_volume_ratio']}x per volume), "
        f"NodeGetVolumeStats {result['stats_ratio']}x, stage+publish {result['stage_ratio']}x, unpublish+unstage "
        f"{result['unstage_ratio']}x (goals 1.2x; if only the programs and mount-table reads grew: "
        f"{result['kernel_floor_stage_ratio']}x, {result['kernel_floor_unstage_ratio']}x; the node's own part: "
        f"{result['own_stage_ratio']}x, {result['own_unstage_ratio']}x); RSS {top['rss_kib']} KiB\n"
        f"  ms added per stage+publish: {added(result['stage_ms_added'])}\n"
        f"  ms added per unpublish+unstage: {added(result['unstage_ms_added'])}"
    )


def main() -> None:
    run_and_report(parser().parse_args())


if __name__ == "__main__":
    main()
