"""Benchmark: NodeStage + NodePublish through the driver vs. the bare sequence a script would run (nvme
connect of the same portals, wait for the device, mkfs, mount, bind mount), alternated round by round in one
lab VM run (TCG: compare the ratio, not the absolute times), and the way down the same way: NodeUnpublish +
NodeUnstage vs umount + nvme disconnect, ControllerUnpublish + DeleteVolume vs the durable raw configfs script
(bench/stage_guest.py); then, in the same run (bench/node_guest.py), the
data path through the driver vs the raw namespace (fio), stage latency with 64 and 128 other controllers on
the node, and the node plugin's RSS and open files over many stage/unstage cycles.
Writes results/bench-stage.json and results/bench-node.json.

usage: python -m bench.stage [--rounds 6] [--fio-seconds 4] [--fio-rounds 8] [--scale-rounds 5] [--cycles 500]
                             [--controllers 64 128] [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import json
import time

from bench.results import growth, in_one_vm, save
from lab.build import REPO
from lab.stack import DRIVER_SOCK, GuestDriver, running_stack
from lab.target import POOL_DIR


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="stage rounds (each kind)")
    ap.add_argument("--fio-seconds", type=float, default=4, help="seconds per fio job")
    ap.add_argument("--fio-rounds", type=int, default=8, help="rounds of every fio job on every target (median)")
    ap.add_argument("--scale-rounds", type=int, default=5, help="stages timed per controller count")
    ap.add_argument("--cycles", type=int, default=500, help="stage/unstage cycles of the resource run")
    ap.add_argument("--controllers", type=int, nargs="+", default=[64, 128], help="other controllers to stage beside")
    ap.add_argument("--quick", action="store_true", help="4 rounds, 2 s fio twice, 5 scaling rounds, 40 cycles")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: every step once at its smallest size (1 round, two fio jobs of 1 s once, 2 other"
        " controllers, 2 cycles); not a measurement",
    )
    return ap


def run(stack: GuestDriver, args: argparse.Namespace) -> None:
    """The benchmark against a running lab stack (agent and driver); leaves no volume behind."""
    if args.quick:
        args.rounds, args.fio_seconds, args.fio_rounds, args.scale_rounds, args.cycles = 4, 2, 2, 5, 40
    jobs: list[str] = []  # every fio job of the data path
    if args.smoke:  # one 4k and one 128k job still exercise both fio shapes
        args.rounds, args.fio_seconds, args.fio_rounds, args.scale_rounds, args.cycles = 1, 1, 1, 1, 2
        args.controllers, jobs = [2], ["randread-4k-qd16", "write-128k"]
    started, vm = time.monotonic(), stack.vm
    out = vm.check(
        [vm.python, "-m", "bench.stage_guest", DRIVER_SOCK, str(args.rounds), f"{POOL_DIR}-raw"],
        timeout=3600,
        cwd=str(REPO),
    )
    pid = vm.check(["cat", stack.process.pidfile]).strip()
    node_out = vm.check(
        [
            vm.python,
            "-m",
            "bench.node_guest",
            DRIVER_SOCK,
            pid,
            "--fio-seconds",
            str(args.fio_seconds),
            "--fio-rounds",
            str(args.fio_rounds),
            "--scale-rounds",
            str(args.scale_rounds),
            "--cycles",
            str(args.cycles),
            "--controllers",
            *map(str, args.controllers),
            *(["--jobs", *jobs] if jobs else []),
        ],
        timeout=7200,
        cwd=str(REPO),
    )
    facts = {"kernel": vm.ready["kernel"], "accel": vm.accel, "quick": args.quick, "smoke": args.smoke}
    result = json.loads(out.strip().splitlines()[-1])
    result.update(facts, wall_seconds=round(time.monotonic() - started, 1))
    save("stage", result)
    print(
        f"bench stage: NodeStage+NodePublish median {result['csi_median_ms']} ms vs bare connect/mkfs/mount "
        f"{result['bare_median_ms']} ms -> ratio {result['ratio_median']}x ({args.rounds} rounds, {result['accel']})"
    )
    print(
        f"bench stage: NodeUnpublish+NodeUnstage median {result['down_csi_median_ms']} ms vs bare umount/disconnect "
        f"{result['down_bare_median_ms']} ms -> {result['down_ratio_median']}x; ControllerUnpublish+DeleteVolume "
        f"{result['ctl_csi_median_ms']} ms vs the durable raw script {result['ctl_raw_median_ms']} ms -> "
        f"{result['ctl_ratio_median']}x"
    )
    node = json.loads(node_out.strip().splitlines()[-1])
    node.update(facts)
    node["resources"].update(growth(node["resources"]["samples"]))
    save("node", node)
    dp, sc, res = node["datapath"], node["scaling"], node["resources"]
    print(
        f"bench node: data path worst {dp['worst_ratio']}x raw ({dp['ratio']}); published mount vs hand-made ext4"
        f" worst {dp['worst_mount_vs_ext4']}x; stage with other controllers "
        f"{sc['ratio']} of none; node plugin over {res['cycles']} cycles: RSS {res['rss_growth_pct']:+.1f}%, "
        f"open files {res['fd_growth']:+d} after warm-up"
    )


def main() -> None:
    args = parser().parse_args()
    with in_one_vm() as vm, running_stack(vm, "WARNING") as stack:
        run(stack, args)


if __name__ == "__main__":
    main()
