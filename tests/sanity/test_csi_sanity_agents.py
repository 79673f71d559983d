"""csi-sanity v5.6.0, controller specs, against ``serve --mode controller --backend nvmeof`` driving two real
target-agent processes (configfs replaced by plain folders on the host), in mount and block modes. A node
plugin on fabric f1 answers NodeGetInfo (node specs are the node tier's). JUnit:
``results/csi-sanity-host-agents-<mode>.xml``. The lab tier repeats this on real configfs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import Running, start_agent
from tests.support.env import RESULTS
from tests.support.sanity import read_report, sanity_argv, sanity_binary, summary_lines

HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:12345678-1234-1234-1234-123456789abc"


def serve(work: Path, *args: str) -> subprocess.Popen[bytes]:
    sock = Path(args[args.index("--endpoint") + 1].removeprefix("unix://"))
    log = open(work / f"{sock.stem}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "nvmeof_csi", "serve", *args], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (work / f"{sock.stem}.log").read_text()
        time.sleep(0.05)
    return proc


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    agents: list[Running] = [
        start_agent(tmp_path / "a", name="store-a", ports=("1:tcp:127.0.0.1:4420:a", "2:tcp:127.0.0.2:4420:b")),
        start_agent(tmp_path / "b", name="store-b", ports=("1:tcp:127.0.0.1:4421:a",)),
    ]
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text(
        "agents:\n"
        f"  - {{name: store-a, endpoint: '{agents[0].unix}', fabric: f1, transports: [tcp]}}\n"
        f"  - {{name: store-b, endpoint: '{agents[1].unix}', fabric: f2, transports: [tcp]}}\n"
    )
    ctrl, node = tmp_path / "ctrl.sock", tmp_path / "node.sock"
    procs = [
        serve(
            tmp_path,
            "--mode",
            "controller",
            "--backend",
            "nvmeof",
            "--fabric-map",
            str(fabric),
            "--endpoint",
            f"unix://{ctrl}",
        ),
        serve(
            tmp_path,
            "--mode",
            "node",
            "--backend",
            "loop",
            "--fabric",
            "f1",
            "--node-id",
            HOST_NQN,
            "--kubelet-root",
            str(tmp_path),
            "--endpoint",
            f"unix://{node}",
            "--state-dir",
            str(tmp_path / "node"),
        ),
    ]
    yield ctrl, node
    for proc in [*procs, *(a.proc for a in agents)]:
        proc.send_signal(signal.SIGTERM)
    for proc in [*procs, *(a.proc for a in agents)]:
        assert proc.wait(30) == 0


@pytest.mark.parametrize("mode", ["mount", "block"])
def test_controller_specs_against_agents(
    stack: tuple[Path, Path], tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ctrl, node = stack
    RESULTS.mkdir(exist_ok=True)
    report = RESULTS / f"csi-sanity-host-agents-{mode}.xml"
    report.unlink(missing_ok=True)
    argv = sanity_argv(
        sanity_binary(),
        str(node),
        str(tmp_path),
        mode,
        str(report),
        controller_endpoint=str(ctrl),
        size=64 << 20,
        extra=("--ginkgo.skip=Node Service",),
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
    with capsys.disabled():
        print(f"\ncsi-sanity host agents ({mode}): {summary_lines(proc.stdout)}")
    assert proc.returncode == 0, proc.stdout[-6000:]
    result = read_report(report.read_text())
    assert result.failures == 0 and result.ran >= 50, result
    leftovers = [p for p in (tmp_path / "a" / "pool" / "volumes").iterdir()]
    assert leftovers == [], "csi-sanity cleaned up, so the agents must hold no volumes"
