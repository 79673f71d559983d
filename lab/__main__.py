"""``python -m lab``: build the lab images, or boot the VM and run commands in it."""

from __future__ import annotations

import argparse
import shlex
import sys

from lab.build import BuildError, build
from lab.vm import LabError, LabVM


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="install packages, fetch the kernel, build the initramfs (idempotent)")
    b.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    r = sub.add_parser("run", help="boot the VM, run each command (a shell-quoted string) in the guest, stop")
    r.add_argument("commands", nargs="+", help="e.g. 'nvme version' 'uname -r'")
    r.add_argument("--timeout", type=float, default=120, help="per-command timeout in seconds")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(force=args.force)
            return 0
        with LabVM() as vm:
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
