"""``nvmeof-csi demo``: the whole driver on a real kernel fabric, end to end, in the lab VM.

Boots the lab (building it first if needed), starts our target agent and ``serve --mode all --backend nvmeof``
inside it, and through CSI gRPC: provisions a volume, attaches, stages and publishes it (ext4 over two NVMe/TCP
portals, one native-multipath device), writes a known data set, fails the optimized path over under a
write+verify I/O probe (ANA: optimized -> inaccessible through our agent), reads every byte back, expands the
volume online, then tears it all down. Prints a report (time per phase, ANA states before and after, bytes
verified) and returns it.

Contract: :func:`run_demo` returns a :class:`DemoReport` whose ``ok`` is True only when every check held
(no probe error, every file's checksum matches, the filesystem grew, nothing left connected or mounted); the VM
is always powered off, whatever fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.build import BuildError, BuildInfo, build
from lab.fabric import Fabric
from lab.probe import IoProbe
from lab.stack import GuestDriver, running_stack
from lab.vm import LabVM

MiB = 1 << 20
Say = Callable[[str], None]


@dataclass
class DemoReport:
    phases: list[tuple[str, float]] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    ana_before: dict[str, str] = field(default_factory=dict)
    ana_after: dict[str, str] = field(default_factory=dict)
    bytes_written: int = 0
    bytes_verified: int = 0
    probe: dict[str, Any] = field(default_factory=dict)
    capacity_before: int = 0
    capacity_after: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.checks) and all(ok for _, ok, _ in self.checks)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append((name, ok, detail))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@contextmanager
def _phase(report: DemoReport, name: str, say: Say) -> Iterator[None]:
    say(f"{name} ...")
    begin = time.monotonic()
    try:
        yield
    finally:
        report.phases.append((name, round(time.monotonic() - begin, 3)))


def _ana(fabric: Fabric, nqn: str) -> dict[str, str]:
    return {p.address.split(",")[0].removeprefix("traddr="): p.ana_state for p in fabric.paths(nqn)}


def _csi_phases(report: DemoReport, steps: list[dict[str, Any]]) -> None:
    for step in steps:
        report.phases.append((f"  of which CSI {step['op']}", step["seconds"]))


def _exercise(driver: GuestDriver, report: DemoReport, say: Say, size: int, files: int) -> None:
    vm, fabric = driver.vm, Fabric(driver.vm)
    with _phase(report, "provision, attach, stage, publish (CSI)", say):
        steps = driver.csi(
            {"op": "create", "name": "demo", "size": size, "mode": "mount", "fs": "ext4"},
            {"op": "attach", "name": "demo"},
            {"op": "stage", "name": "demo"},
            {"op": "publish", "name": "demo"},
        )
    _csi_phases(report, steps)
    nqn = steps[0]["nqn"]
    report.capacity_before = steps[0]["capacity"]
    driver.agent.ctl("ana", "set", "b", "non-optimized")  # path a carries the I/O until it fails
    fabric.wait_paths(nqn, live=2, timeout=60)
    time.sleep(1)  # the ANA change notice reaches the host
    report.ana_before = _ana(fabric, nqn)
    say(f"volume {steps[0]['volume_id']}: portals {steps[0]['portals']}, ANA {report.ana_before}")

    with _phase(report, f"write data set ({files} files x 1 MiB)", say):
        steps = driver.csi(
            {"op": "write-dataset", "name": "demo", "files": files, "kib": 1024},
            {"op": "probe-target", "name": "demo", "mib": 16},
        )
    report.bytes_written = steps[0]["bytes"]

    with _phase(report, "fail over under I/O (ANA group a -> inaccessible)", say):
        probe = IoProbe(vm, steps[1]["path"], seconds=12)
        time.sleep(3)
        driver.agent.ctl("ana", "set", "a", "inaccessible")
        result = probe.result()
    report.probe = {
        "ios": result.ios,
        "errors": result.errors,
        "longest_stall_s": result.max_gap_s,
        "ios_after_last_stall": result.ios_after_last_stall,
    }
    report.ana_after = _ana(fabric, nqn)
    report.check("I/O through the failover", result.errors == 0 and result.ios_after_last_stall > 0, result.line())
    moved = report.ana_after.get("127.0.0.1") == "inaccessible" and report.ana_after.get("127.0.0.2") in (
        "optimized",
        "non-optimized",
    )
    report.check("ANA moved to the other path", moved, f"{report.ana_before} -> {report.ana_after}")

    with _phase(report, "read everything back (page cache dropped)", say):
        verify = driver.one("verify-dataset", "demo")
    report.bytes_verified = verify["bytes_verified"]
    report.check(
        "data set read back",
        verify["mismatched"] == 0 and report.bytes_verified == report.bytes_written,
        f"{report.bytes_verified} of {report.bytes_written} bytes, {verify['mismatched']} files differ",
    )

    with _phase(report, "expand online (controller + node)", say):
        grown = driver.one("expand", "demo", size=2 * size)
    report.capacity_after = grown["controller_bytes"]
    report.check(
        "volume and filesystem grew",
        grown["controller_bytes"] >= 2 * size and grown["filesystem_bytes"] > size,
        f"volume {grown['controller_bytes']} B, ext4 {grown['filesystem_bytes']} B",
    )

    with _phase(report, "ANA groups back to optimized (nvmeofctl, twice)", say):
        driver.agent.ctl("ana", "set", "a", "optimized")
        driver.agent.ctl("ana", "set", "b", "optimized")
    with _phase(report, "unpublish, unstage, detach, delete (CSI)", say):
        steps = driver.csi(*({"op": op, "name": "demo"} for op in ("unpublish", "unstage", "detach", "delete")))
    _csi_phases(report, steps)
    left = fabric.paths(nqn)
    report.check(
        "nothing left connected or mounted",
        not left and not driver.mounts(),
        f"{len(left)} controllers, {len(driver.mounts())} mounts",
    )


def run_demo(say: Say = print, size_mib: int = 512, files: int = 64) -> DemoReport:
    report = DemoReport()
    try:
        with _phase(report, "lab build (cached)", say):
            try:
                BuildInfo.load()
            except BuildError:
                build()
        say("boot the lab VM ...")
        with LabVM() as vm:
            report.phases.append(("boot the lab VM", round(vm.boot_seconds, 3)))
            Fabric(vm).load()
            begin = time.monotonic()
            say("start agent + driver in the guest ...")
            with running_stack(vm, "WARNING") as driver:
                report.phases.append(("start agent + driver in the guest", round(time.monotonic() - begin, 3)))
                _exercise(driver, report, say, size_mib * MiB, files)
    except Exception as exc:  # the demo's one error boundary: any failure becomes the report's error line
        report.error = f"{type(exc).__name__}: {exc}"
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.demo --json FILE [--size-mib N] [--files N]``: run the demo, write its report as JSON,
    exit 0 only when every check held (``nvmeof-csi demo`` runs this in the source checkout)."""
    parser = argparse.ArgumentParser(prog="python -m lab.demo", description=main.__doc__)
    parser.add_argument("--json", required=True, type=Path, help="where the report goes (JSON)")
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--files", type=int, default=64)
    args = parser.parse_args(argv)
    report = run_demo(say=lambda line: print(f"demo: {line}", flush=True), size_mib=args.size_mib, files=args.files)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
