"""Every benchmark in one lab VM boot: provisioning (its own agent), then one driver stack for NodeStage and the
node's data path and scaling, path loss and QoS; then the dataset benchmark on this host. Each writes its
``results/bench-*.json`` as it would run alone (``python -m bench.<name>``, its own VM); one boot and one stack
start instead of four of each is what CI's bench tier saves. Then ``scale-agent-lab`` (the agent's cost against
volumes held on the kernel's nvmet configfs) boots a lab VM of its own and ``across`` (failover between machines
beside the same on one machine) boots the lab cluster; the scale benchmarks (``scale-agent``, ``scale-controller``,
``scale-node``: cost against volumes held, agents in the map, volumes published on a node) run on this host. A
benchmark that fails is reported and the next one still runs; the exit code is 1 when any failed.

``--smoke`` (CI's bench tier) runs every benchmark's code path once at its smallest sizes: it proves the
benchmarks still work, and the report it leads to says "smoke: not a measurement". The performance goals are
judged on the full suite (``./dev bench``, no flag). ``scale-agent-lab``, ``across``, ``k8s-pvcs`` (many claims
at once through the real external-provisioner) and ``k8s-spread`` (claims and pods spread over both GPU nodes),
the last two on one lab Kubernetes cluster, are left out of ``--smoke`` unless named with
``--only`` (each boots a cluster of its own: CI's budget goes to the k8s tier's scenarios; ``--smoke --only
k8s-pvcs k8s-spread`` runs their smokes on one boot).

usage: python -m bench.suite [--quick | --smoke] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial

from bench import (
    across,
    dataset,
    k8s_pvcs,
    k8s_spread,
    pathloss,
    provision,
    qos,
    scale_agent,
    scale_controller,
    scale_node,
    stage,
)
from bench.results import in_one_vm
from lab import Fabric, GuestError, LabError, LabVM
from lab.cluster import LabCluster
from lab.kube.cluster import running_cluster
from lab.stack import GuestDriver, running_stack

#: the benchmarks that share the driver stack: name -> (its argument parser, its run)
ON_STACK: dict[str, tuple[Callable[[], argparse.ArgumentParser], Callable[[GuestDriver, argparse.Namespace], None]]] = {
    "stage": (stage.parser, stage.run),
    "pathloss": (pathloss.parser, pathloss.run),
    "qos": (qos.parser, qos.run_and_report),
}
#: the benchmarks on this host (no lab VM): name -> (its argument parser, its run)
ON_HOST: dict[str, tuple[Callable[[], argparse.ArgumentParser], Callable[[argparse.Namespace], None]]] = {
    "scale-agent": (scale_agent.parser, scale_agent.run_and_report),
    "scale-controller": (scale_controller.parser, scale_controller.run_and_report),
    "scale-node": (scale_node.parser, scale_node.run_and_report),
}
NAMES = ("provision", *ON_STACK, "dataset", *ON_HOST, "scale-agent-lab", "across", "k8s-pvcs", "k8s-spread")
#: run on a lab VM or cluster of their own, left out of --smoke unless named with --only
OWN_CLUSTER = ("scale-agent-lab", "across", "k8s-pvcs", "k8s-spread")
#: the agent on the kernel's nvmet configfs: the levels a TCG VM fills in minutes, py-spy at each (bench/scale_agent.py)
LAB_SCALE = ["--lab", "--levels", "0", "1000", "4000", "--samples", "50", "--profile", "20"]
#: the benchmarks on the lab Kubernetes cluster (one boot for all): name -> (its argument parser, its run)
ON_KUBE = {"k8s-pvcs": (k8s_pvcs.parser, k8s_pvcs.run_on), "k8s-spread": (k8s_spread.parser, k8s_spread.run_on)}


def in_kube(names: list[str], flags: list[str]) -> None:
    """The named Kubernetes benchmarks, one after another, on one lab Kubernetes cluster booted for them."""
    with running_cluster() as kube:
        for name in names:
            make_parser, run_on = ON_KUBE[name]
            run_on(kube, make_parser().parse_args(flags))


def attempt(name: str, step: Callable[[], None], failed: list[str]) -> None:
    """Run one benchmark; a failure is printed with its traceback and recorded in ``failed``, not raised."""
    began = time.monotonic()
    print(f"bench suite: {name} ...", flush=True)
    try:
        step()
    except (Exception, SystemExit):  # the suite's one boundary: report, go on with the next
        traceback.print_exc()
        failed.append(name)
    print(
        f"bench suite: {name} {'FAILED' if name in failed else 'done'} in {time.monotonic() - began:.0f} s", flush=True
    )


def usable(vm: LabVM) -> bool:
    """The VM still runs commands (a guest that crashed or lost its agent does not)."""
    if not vm.alive():
        return False
    try:
        return vm.run(["true"], timeout=20).rc == 0
    except LabError:
        return False


def in_lab_vm(names: list[str], flags: list[str], failed: list[str]) -> None:
    """The in-VM benchmarks ``names`` in one boot. When the VM dies under one (a TCG guest crash; the error
    carries its console), the benchmarks it did not finish run once more in a fresh VM, once."""
    todo = names
    for boot in (1, 2):
        with in_one_vm() as vm:
            todo = run_in(vm, todo, flags, failed)
        if not todo:
            return
        if boot == 1:
            print(f"bench suite: the lab VM died (see above); once more in a fresh VM: {' '.join(todo)}", flush=True)
    failed.extend(todo)


def run_in(vm: LabVM, todo: list[str], flags: list[str], failed: list[str]) -> list[str]:
    """Run ``todo`` in ``vm``; the benchmarks left undone because the VM died (the one it died under first)."""

    def finished(name: str, step: Callable[[], None]) -> bool:
        attempt(name, step, failed)
        if name in failed and not usable(vm):
            failed.remove(name)  # the VM's death, not the benchmark's verdict
            return False
        return True

    if "provision" in todo and not finished(
        "provision", lambda: provision.run(vm, provision.parser().parse_args(flags))
    ):
        return todo
    on_stack = [n for n in todo if n in ON_STACK]
    left: list[str] = []
    if not on_stack:
        return left
    try:
        with running_stack(vm, "WARNING", tls=True) as stack:
            for i, name in enumerate(on_stack):
                make_parser, bench_run = ON_STACK[name]
                if not finished(name, partial(bench_run, stack, make_parser().parse_args(flags))):
                    left = on_stack[i:]
                    break
    except (LabError, GuestError):
        if not left:
            raise
    return left


def in_cluster(args: argparse.Namespace) -> None:
    """The benchmark across machines on a lab cluster booted for it."""
    with LabCluster().start() as cluster:
        for vm in cluster.vms.values():
            Fabric(vm).load(rdma=True)
        across.run(cluster, args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="every benchmark's quick mode")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="CI: every benchmark's code path once at its smallest sizes; not a measurement",
    )
    ap.add_argument("--only", nargs="+", choices=NAMES, help="run these benchmarks only")
    args = ap.parse_args()
    if args.only is None:
        args.only = [n for n in NAMES if not (args.smoke and n in OWN_CLUSTER)]
    flags = ["--quick"] if args.quick else (["--smoke"] if args.smoke else [])
    failed: list[str] = []
    in_vm = [n for n in NAMES if n in args.only and n not in ("dataset", *OWN_CLUSTER, *ON_HOST)]
    if in_vm:
        in_lab_vm(in_vm, flags, failed)
    if "dataset" in args.only:
        attempt("dataset", lambda: dataset.run(dataset.parser().parse_args(["--smoke"] if args.smoke else [])), failed)
    for name, (make_parser, host_run) in ON_HOST.items():
        if name in args.only:
            attempt(name, partial(host_run, make_parser().parse_args(["--smoke"] if args.smoke else [])), failed)
    if "scale-agent-lab" in args.only:
        lab_flags = ["--lab", "--smoke"] if args.smoke else LAB_SCALE
        lab_args = scale_agent.parser().parse_args(lab_flags)
        attempt("scale-agent-lab", partial(scale_agent.run_and_report, lab_args), failed)
    if "across" in args.only:
        attempt("across", partial(in_cluster, across.parser().parse_args(flags)), failed)
    if on_kube := [n for n in ON_KUBE if n in args.only]:
        attempt(" + ".join(on_kube), partial(in_kube, on_kube, ["--smoke"] if args.smoke else []), failed)
    if failed:
        print(f"bench suite: FAILED {' '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
