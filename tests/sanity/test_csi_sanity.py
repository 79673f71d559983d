"""csi-sanity (kubernetes-csi/csi-test v5.4.0, the real binary) against ``nvmeof-csi serve --mode all``
with the loop development backend, in mount and block access modes. JUnit files:
``results/csi-sanity-host-<mode>.xml``."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RESULTS, ROOT, need, root_with_loop


def sanity_binary() -> str:
    path = os.environ.get("CSI_SANITY") or str(ROOT / "tools" / "bin" / "csi-sanity")
    if not Path(path).exists():
        path = shutil.which("csi-sanity") or path
    need(Path(path).exists(), f"csi-sanity not found at {path} (.ci/run installs it)")
    return path


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Path]:
    root_with_loop()
    sock = tmp_path / "csi.sock"
    log = (tmp_path / "driver.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvmeof_csi", "serve", "--mode", "all", "--endpoint", f"unix://{sock}",
         "--state-dir", str(tmp_path / "state"), "--node-id", "sanity-node", "--max-volumes-per-node", "8",
         "--loop-capacity", "2T"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None, (tmp_path / "driver.log").read_text()
        assert time.monotonic() < deadline, "driver did not create its socket"
        time.sleep(0.1)
    yield sock
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    assert not sock.exists(), "socket file left behind after SIGTERM"
    leftovers = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp_path) in line]
    assert leftovers == [], leftovers


@pytest.mark.root
@pytest.mark.parametrize("mode", ["mount", "block"])
def test_csi_sanity(driver: Path, tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    RESULTS.mkdir(exist_ok=True)
    report = RESULTS / f"csi-sanity-host-{mode}.xml"
    report.unlink(missing_ok=True)
    argv = [
        sanity_binary(),
        f"--csi.endpoint={driver}",
        f"--csi.stagingdir={tmp_path / 'staging'}",
        f"--csi.mountdir={tmp_path / 'mount'}",
        f"--csi.testvolumeaccesstype={mode}",
        "--csi.testvolumesize=1073741824",
        "--csi.testvolumeexpandsize=2147483648",
        "--csi.testnodevolumeattachlimit",
        f"--ginkgo.junit-report={report}",
        "--ginkgo.no-color",
        "--ginkgo.timeout=15m",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
    summary = [line for line in proc.stdout.splitlines() if re.search(r"Ran \d+ of|Passed|FAIL|\[FAIL\]", line)]
    with capsys.disabled():
        print(f"\ncsi-sanity ({mode}): " + " | ".join(summary[-6:]))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    suite = ET.parse(report).getroot()
    totals = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert totals is not None
    assert int(totals.get("failures", "1")) == 0 and int(totals.get("errors", "0")) == 0
    ran = int(totals.get("tests", "0")) - int(totals.get("skipped", "0")) - int(totals.get("disabled", "0"))
    assert ran >= 50, f"only {ran} specs ran"
