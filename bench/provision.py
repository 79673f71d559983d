"""Benchmark: creates + deletes through the target agent vs. a minimal script doing the same configfs
writes and file operations (once as a bare script, once with the agent's durability), alternated in batches
in one lab VM run (TCG: compare the ratio, not the absolute times); then throughput with 16 concurrent
clients vs one, and the agent's RSS and open files over many create/delete cycles (bench/provision_guest.py).
Writes results/bench-provision.json.

usage: python -m bench.provision [--rounds 8] [--batch 25] [--concurrency 16] [--cycles 500] [--profile 60]
                                 [--repeats 5] [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import json
import time

from bench.results import growth, in_one_vm, save
from lab import LabVM, Portal
from lab.build import REPO
from lab.target import POOL_DIR, GuestTargetAgent


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8, help="latency rounds (batches of each kind)")
    ap.add_argument("--batch", type=int, default=25, help="volumes per batch")
    ap.add_argument("--concurrency", type=int, default=16, help="clients of the throughput run")
    ap.add_argument("--cycles", type=int, default=500, help="create/delete cycles of the resource run")
    ap.add_argument("--profile", type=int, default=60, help="seconds of create/delete cycles sampled by py-spy")
    ap.add_argument(
        "--repeats", type=int, default=5, help="alternated rounds of the throughput runs (agent and script)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="4 rounds, 200 resource cycles, 20 s profile, 2 throughput rounds"
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: every step once at its smallest size (1 round of 2, 2 clients, 10 cycles, 3 s profile);"
        " not a measurement",
    )
    return ap


def run(vm: LabVM, args: argparse.Namespace) -> None:
    """The benchmark in a booted lab VM with the fabric loaded and no agent running; leaves none running."""
    if args.quick:
        args.rounds, args.cycles, args.profile, args.repeats = 4, 200, 20, 2
    if args.smoke:
        args.rounds, args.batch, args.concurrency, args.cycles, args.profile, args.repeats = 1, 2, 2, 10, 3, 1
    started = time.monotonic()
    agent = GuestTargetAgent(vm, [Portal(1, "tcp", "127.0.0.1", 4420), Portal(2, "tcp", "127.0.0.2", 4421)])
    agent.wipe()
    agent.start()
    try:
        pid = vm.check(["cat", "/run/nvmeof-csi/agent.pid"]).strip()
        out = vm.check(
            [
                vm.python,
                "-m",
                "bench.provision_guest",
                "/run/nvmeof-csi/agent.sock",
                str(args.rounds),
                str(args.batch),
                f"{POOL_DIR}-raw",
                pid,
                str(args.concurrency),
                str(args.cycles),
                str(args.profile),
                str(args.repeats),
            ],
            timeout=3600,
            cwd=str(REPO),
        )
    finally:
        agent.stop()
        agent.wipe()
    result = json.loads(out.strip().splitlines()[-1])
    result.update(
        kernel=vm.ready["kernel"],
        accel=vm.accel,
        wall_seconds=round(time.monotonic() - started, 1),
        quick=args.quick,
        smoke=args.smoke,
        **growth(result["resources"]),
    )
    save("provision", result)
    print(
        f"bench provision: agent {result['agent_ms_per_create']} ms/create {result['agent_ms_per_delete']} ms/delete"
        f" vs raw {result['raw_ms_per_create']} / {result['raw_ms_per_delete']} ms"
        f" -> ratio {result['ratio_total']}x; vs the durable script {result['durable_ms_per_create']} /"
        f" {result['durable_ms_per_delete']} ms -> {result['ratio_vs_durable']}x ({result['operations_each']} each,"
        f" {result['accel']})"
    )
    print(
        f"bench provision: the agent's own system calls as a script {result['contract_ms_per_create']} /"
        f" {result['contract_ms_per_delete']} ms ({result['ratio_contract_vs_durable']}x the durable script); with a"
        f" bare gRPC round trip per call {result['ratio_floor_contract_grpc']}x: the agent is"
        f" {result['ratio_agent_vs_contract_grpc']}x that floor"
    )
    print(
        f"bench provision: {result['concurrency']} clients {result['cycles_per_s_n']} cycles/s vs 1 client"
        f" {result['cycles_per_s_1']} -> {result['concurrency_speedup']}x (agent CPU"
        f" {result['agent_cpu_ms_per_cycle_1']} ms of {result['wall_ms_per_cycle_1']} ms per cycle with one client,"
        f" {result['guest_cpus']} vCPUs; the durable script itself: {result['script_concurrency_speedup']}x with"
        f" {result['concurrency']} processes; the agent at {result['speedup_vs_script_ceiling']} of that ceiling,"
        f" medians of {result['throughput_repeats']} alternated rounds: {result['ceiling_share_runs']});"
        f" empty RPC {result['rpc_floor_ms']} ms"
        f" ({result['rpc_floor_agent_cpu_ms']} ms agent CPU), to a server that does nothing {result['bare_grpc_ms']}"
        f" ms: floor of any gRPC agent vs the durable script {result['ratio_floor_any_grpc_agent']}x;"
        f" agent over {result['resource_cycles']}"
        f" cycles: RSS {result['rss_growth_pct']:+.1f}%, open files {result['fd_growth']:+d} after warm-up"
    )
    where = result["profile"]
    print(
        f"bench provision: what the agent is busy with (py-spy, {where['samples']} samples over"
        f" {where['cycles']} cycles of {where['wall_ms_per_cycle']} ms, {where['agent_cpu_ms_per_cycle']} ms CPU): "
        + ", ".join(f"{k} {100 * v:.0f}%" for k, v in where["share"].items())
        + f"; pathlib in {100 * where['pathlib_share']:.0f}% of samples"
    )


def main() -> None:
    args = parser().parse_args()
    with in_one_vm() as vm:
        run(vm, args)


if __name__ == "__main__":
    main()
