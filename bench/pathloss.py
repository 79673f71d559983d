"""Benchmark: how long I/O stalls when one path of a published volume is black-holed (packets to its portal
silently dropped: a dead link, not a refused connection), for several keep-alive timeouts, through the
driver in one lab VM run. Writes results/bench-pathloss.json, with each run's I/O timeline.

For each ``keepAliveTmo`` (a StorageClass parameter; the driver's default is 5 s) a volume is created, staged
and published (ext4, two TCP paths), a 4 KiB O_DIRECT write+verify probe runs on a file in it, and 3 s in
the first path is black-holed. The stall is the probe's longest gap between two completions; errors must be
0. The figure of the performance goals is the stall at the default keep-alive against ``keep-alive + 1 s``,
and the fitted line ``stall = slope * keepAliveTmo + offset`` over all runs shows where the floor comes from.
With TLS (``tls: psk``, the agent's TLS portals) the same run at the same keep-alive gives the stall of an encrypted
volume side by side with the clear-text one (``tls_runs``; each path that comes back does a TLS handshake).

usage: python -m bench.pathloss [--kato 1 2 3 5] [--rounds 2] [--quick | --smoke] [--no-tls]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.results import in_one_vm, save
from lab import Fabric, IoProbe
from lab.stack import GuestDriver, running_stack
from lab.target import TWO_PORTALS, TWO_TLS_PORTALS

MiB = 1 << 20
DEFAULT_KATO = 5
LEAD_S = 3.0
TIMELINE_MS = 100.0


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(slope, offset)`` of ``y = slope * x + offset``; ``(0, mean y)`` with one distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return 0.0, statistics.fmean(y for _, y in points)
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def one_run(stack: GuestDriver, kato: int, index: int, tls: bool = False) -> dict[str, Any]:
    """One black-holed path under the probe on a fresh volume with ``keepAliveTmo`` = ``kato`` (``tls``: an
    NVMe/TCP TLS volume on the agent's TLS portals)."""
    fabric, first = Fabric(stack.vm), (TWO_TLS_PORTALS if tls else TWO_PORTALS)[0]
    name = f"pl-{kato}-{index}{'-tls' if tls else ''}"
    steps = stack.csi(
        {
            "op": "up",
            "name": name,
            "size": 64 * MiB,
            "mode": "mount",
            "fs": "ext4",
            "params": {"keepAliveTmo": str(kato), **({"tls": "psk"} if tls else {})},
        },
        {"op": "probe-target", "name": name, "mib": 8},
    )
    nqn, path = steps[0]["nqn"], steps[1]["path"]
    fabric.wait_paths(nqn, live=2, timeout=60)
    seconds = LEAD_S + 2.5 * kato + 6
    probe = IoProbe(stack.vm, path, seconds=seconds, timeline_ms=TIMELINE_MS)
    time.sleep(LEAD_S)
    fabric.blackhole(first.trsvcid, on=True)
    try:
        result = probe.result()
    finally:
        fabric.blackhole(first.trsvcid, on=False)
    fabric.wait_paths(nqn, live=2, timeout=120)
    stack.csi({"op": "down", "name": name})
    return {
        "tls": tls,
        "keep_alive_s": kato,
        "stall_s": result.max_gap_s,
        "errors": result.errors,
        "ios": result.ios,
        "resumed_ios": result.ios_after_last_stall,
        "stalls": result.stalls[:5],
        "timeline_ms": TIMELINE_MS,
        "timeline": result.timeline,
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--kato", type=int, nargs="+", default=[1, 2, 3, DEFAULT_KATO], help="keep-alive timeouts to measure (seconds)"
    )
    ap.add_argument("--rounds", type=int, default=2, help="runs per keep-alive timeout")
    ap.add_argument("--quick", action="store_true", help="keep-alive 2 and 5 s, one run each")
    ap.add_argument("--smoke", action="store_true", help="CI: keep-alive 2 s, one run; not a measurement")
    ap.add_argument("--no-tls", dest="tls", action="store_false", help="no TLS runs (the stack has no TLS portals)")
    return ap


def run(stack: GuestDriver, args: argparse.Namespace) -> None:
    """The benchmark against a running lab stack (agent and driver); leaves no volume behind."""
    katos, rounds = ([2, DEFAULT_KATO], 1) if args.quick else (sorted(set(args.kato)), args.rounds)
    if args.smoke:
        katos, rounds = [2], 1
    started, vm = time.monotonic(), stack.vm
    runs: list[dict[str, Any]] = []
    for index in range(rounds):
        for kato in katos:
            runs.append(one_run(stack, kato, index))
            print(
                f"bench pathloss: keep-alive {kato}s -> stall {runs[-1]['stall_s']:.2f}s, {runs[-1]['errors']} errors",
                flush=True,
            )
    tls_kato = katos[-1]  # the default keep-alive, or the only one measured
    tls_runs = [one_run(stack, tls_kato, index, tls=True) for index in range(rounds)] if args.tls else []
    for r in tls_runs:
        print(f"bench pathloss: TLS, keep-alive {tls_kato}s -> stall {r['stall_s']:.2f}s, {r['errors']} errors")
    clear_same = [r["stall_s"] for r in runs if r["keep_alive_s"] == tls_kato]
    slope, offset = fit([(r["keep_alive_s"], r["stall_s"]) for r in runs])
    default = [r["stall_s"] for r in runs if r["keep_alive_s"] == DEFAULT_KATO]
    result = {
        "quick": args.quick,
        "smoke": args.smoke,
        "runs": runs,
        "default_keep_alive_s": DEFAULT_KATO,
        "default_stall_s": max(default) if default else None,
        "errors": sum(r["errors"] for r in [*runs, *tls_runs]),
        "tls_runs": tls_runs,
        "tls_keep_alive_s": tls_kato if tls_runs else None,
        "tls_stall_s": max(r["stall_s"] for r in tls_runs) if tls_runs else None,
        "clear_stall_s_same_keep_alive": max(clear_same) if tls_runs else None,
        "fit_slope": round(slope, 3),
        "fit_offset_s": round(offset, 3),
        "kernel": vm.ready["kernel"],
        "accel": vm.accel,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    save("pathloss", result)
    if result["errors"]:
        raise AssertionError(f"bench pathloss: {result['errors']} I/O errors through a black-holed path")
    print(
        f"bench pathloss: stall = {slope:.2f} x keep-alive + {offset:.2f}s; at the default {DEFAULT_KATO}s: "
        f"{result['default_stall_s']}s (goal {DEFAULT_KATO + 1}s), {result['errors']} errors"
    )


def main() -> None:
    args = parser().parse_args()
    with in_one_vm() as vm, running_stack(vm, "WARNING", tls=True) as stack:
        run(stack, args)


if __name__ == "__main__":
    main()
