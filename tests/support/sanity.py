"""Running the csi-sanity binary and reading its JUnit report (shared by the host and lab tiers)."""

from __future__ import annotations

import os
import re
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import LabVM
from lab.stack import KUBELET_ROOT
from tests.support.env import RESULTS, ROOT, need

MUTABLE = ROOT / "tests" / "support" / "sanity-mutable.yaml"  # VolumeAttributesClass parameters (ModifyVolume specs)


def sanity_binary() -> str:
    path = os.environ.get("CSI_SANITY") or str(ROOT / "tools" / "bin" / "csi-sanity")
    if not Path(path).exists():
        path = shutil.which("csi-sanity") or path
    need(Path(path).exists(), f"csi-sanity not found at {path} (.ci/run installs it)")
    return path


def sanity_argv(
    binary: str,
    endpoint: str,
    workdir: str,
    mode: str,
    report: str,
    controller_endpoint: str = "",
    size: int = 1 << 30,
    extra: tuple[str, ...] = (),
) -> list[str]:
    argv = [
        binary,
        f"--csi.endpoint={endpoint}",
        f"--csi.stagingdir={workdir}/staging",
        f"--csi.mountdir={workdir}/mount",
        f"--csi.testvolumeaccesstype={mode}",
        f"--csi.testvolumesize={size}",
        f"--csi.testvolumeexpandsize={2 * size}",
        f"--ginkgo.junit-report={report}",
        "--ginkgo.no-color",
        "--ginkgo.timeout=20m",
        f"--csi.testvolumemutableparameters={MUTABLE}",
        *extra,
    ]
    if controller_endpoint:
        argv.append(f"--csi.controllerendpoint={controller_endpoint}")
    return argv


@dataclass(frozen=True)
class SanityResult:
    tests: int
    failures: int
    skipped: int

    @property
    def ran(self) -> int:
        return self.tests - self.skipped


def read_report(text: str) -> SanityResult:
    root = ET.fromstring(text)
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    skipped = int(suite.get("skipped", "0")) + int(suite.get("disabled", "0"))
    failures = int(suite.get("failures", "0")) + int(suite.get("errors", "0"))
    return SanityResult(int(suite.get("tests", "0")), failures, skipped)


def summary_lines(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if re.search(r"Ran \d+ of|Passed|\[FAIL\]", line)]
    return " | ".join(lines[-6:])


def run_in_lab(
    vm: LabVM,
    endpoint: str,
    mode: str,
    name: str,
    report: Callable[[str, str], None],
    timeout: float,
    **options: Any,
) -> SanityResult:
    """csi-sanity inside the lab VM against ``endpoint`` (64 MiB volumes); its JUnit report is copied to
    ``results/<name>.xml`` and its summary reported. Fails the test when csi-sanity exits non-zero."""
    work, guest_report = f"{KUBELET_ROOT}/{name}", f"/tmp/{name}.xml"
    vm.mkdir(work)
    argv = sanity_argv(sanity_binary(), endpoint, work, mode, guest_report, size=64 << 20, **options)
    start = time.monotonic()
    res = vm.run(argv, timeout=timeout)
    report(name, f"{summary_lines(res.out)} [{time.monotonic() - start:.0f}s]")
    RESULTS.mkdir(exist_ok=True)
    xml = vm.read(guest_report)
    (RESULTS / f"{name}.xml").write_text(xml)
    assert res.rc == 0, res.out[-8000:]
    return read_report(xml)
