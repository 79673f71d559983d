"""csi-sanity (kubernetes-csi/csi-test v5.6.0, the real binary) against ``nvmeof-csi serve --mode all``
with the loop development backend, in mount and block access modes. JUnit files:
``results/csi-sanity-host-<mode>.xml``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import RESULTS, root_with_loop
from tests.support.sanity import read_report, sanity_argv, sanity_binary, summary_lines


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Path]:
    root_with_loop()
    sock = tmp_path / "csi.sock"
    log = (tmp_path / "driver.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nvmeof_csi",
            "serve",
            "--mode",
            "all",
            "--endpoint",
            f"unix://{sock}",
            "--state-dir",
            str(tmp_path / "state"),
            "--node-id",
            "sanity-node",
            "--max-volumes-per-node",
            "8",
            "--loop-capacity",
            "2T",
            "--kubelet-root",
            str(tmp_path),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
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
    argv = sanity_argv(
        sanity_binary(),
        str(driver),
        str(tmp_path),
        mode,
        str(report),
        extra=("--csi.testnodevolumeattachlimit",),
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
    with capsys.disabled():
        print(f"\ncsi-sanity host ({mode}): {summary_lines(proc.stdout)}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    result = read_report(report.read_text())
    assert result.failures == 0 and result.ran >= 50, result
