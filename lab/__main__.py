"""``python -m lab``: build the lab images, boot the VM and run commands in it, or boot the three-machine cluster."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time

from lab.build import KERNELS, BuildError, build
from lab.cluster import LINKS, LabCluster
from lab.vm import LabError, LabVM


def hold_cluster(kernel: str | None, hold: float) -> int:
    with LabCluster(kernel=kernel) as cluster:
        for name, vm in cluster.vms.items():
            links = "  ".join(f"{link} {cluster.address(name, link)}" for link in LINKS)
            print(f"{name:10} booted in {vm.boot_seconds:5.1f}s  {vm.hostnqn}  {links}")
        print(f"# links live in network namespace {cluster.links.namespace}; Ctrl-C stops everything", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(hold or 10**9)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="install packages, fetch the kernel, build the initramfs (idempotent)")
    b.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    b.add_argument(
        "--kernel",
        choices=[*KERNELS, "all"],
        default=None,
        help="lab kernel flavour to build (default: $LAB_KERNEL, else 6.12); 'all' builds every one",
    )
    r = sub.add_parser("run", help="boot the VM, run each command (a shell-quoted string) in the guest, stop")
    r.add_argument("commands", nargs="+", help="e.g. 'nvme version' 'uname -r'")
    r.add_argument("--timeout", type=float, default=120, help="per-command timeout in seconds")
    r.add_argument(
        "--kernel",
        choices=list(KERNELS),
        default=None,
        help="lab kernel flavour to boot (default: $LAB_KERNEL, else 6.12)",
    )
    c = sub.add_parser(
        "cluster",
        help="boot storage-1, gpu-1 and gpu-2 on their links (lab/cluster.py), print them, hold until Ctrl-C",
    )
    c.add_argument("--hold", type=float, default=0, help="stop after this many seconds (default: until Ctrl-C)")
    c.add_argument("--kernel", choices=list(KERNELS), default=None, help="lab kernel flavour to boot")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for kernel in KERNELS if args.kernel == "all" else [args.kernel]:
                build(kernel, force=args.force)
            return 0
        if args.command == "cluster":
            return hold_cluster(args.kernel, args.hold)
        with LabVM(kernel=args.kernel) as vm:
            print(f"# booted in {vm.boot_seconds:.1f}s ({vm.accel}), kernel {vm.ready['kernel']}")
            rc = 0
            for command in args.commands:
                res = vm.run(shlex.split(command), timeout=args.timeout)
                print(f"$ {command}  (rc={res.rc}, {res.seconds:.2f}s)\n{res.out}{res.err}", end="")
                rc = rc or res.rc
            return rc
    except (BuildError, LabError) as err:
        print(f"lab: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
