"""``python -m lab``: build the lab images, or boot the VM and run commands in it."""

from __future__ import annotations

import argparse
import shlex
import sys

from lab.build import KERNELS, BuildError, build
from lab.vm import LabError, LabVM


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
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for kernel in KERNELS if args.kernel == "all" else [args.kernel]:
                build(kernel, force=args.force)
            return 0
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
