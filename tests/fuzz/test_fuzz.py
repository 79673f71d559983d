"""The fuzz tier: hypothesis-generated requests against running servers, for every RPC.

- CSI: ``nvmeof-csi serve --mode all --backend loop`` (a real process; its kubelet root and state are temp
  folders) — every Identity, Controller and Node RPC.
- The target agent: ``nvmeof-csi agent`` on a plain folder standing in for configfs — every agent RPC.

Each request is built from the RPC's request descriptor with hostile values (``tests.support.protofuzz``).
Asserts, for every request: never INTERNAL or UNKNOWN; the server stays up; no traceback and no secret in its
log; nothing created, changed or removed in a watched folder outside the servers' roots (requests aim paths at
it, directly, through ``..`` and through a symlink). Bounded: ``FUZZ_EXAMPLES`` requests per RPC (default 60).
The number of requests per RPC is written to ``results/fuzz-requests.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.gen import nvmeof_agent_pb2 as apb
from nvmeof_csi.gen import nvmeof_agent_pb2_grpc as apb_grpc
from tests.support.agents import start_agent
from tests.support.env import RESULTS, root_with_loop
from tests.support.protofuzz import SECRET_MARKER, hostile_strings, message

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@pytest.fixture(scope="module")
def counts() -> Iterator[Counter[str]]:
    """Requests sent per RPC; written to ``results/fuzz-requests.json`` (and printed) when the module is done,
    whichever tests ran and in whatever order."""
    sent: Counter[str] = Counter()
    yield sent
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fuzz-requests.json").write_text(json.dumps(dict(sorted(sent.items())), indent=1) + "\n")
    print(f"\nfuzz: {sum(sent.values())} requests over {len(sent)} RPCs: {dict(sorted(sent.items()))}")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry below ``folder`` (symlinks not followed) with its size and mtime."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(root) / name
            st_ = path.lstat()
            found[str(path)] = (st_.st_size, st_.st_mtime_ns)
    return found


def watched_folder(base: Path) -> Path:
    watched = base / "watched"
    watched.mkdir()
    (watched / "victim").write_text("precious")
    (watched / "dir").mkdir()
    (watched / "dir" / "file").write_text("precious too")
    (watched / "link-to-root").symlink_to("/")
    return watched


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    log: Path
    channel: grpc.Channel
    watched: Path
    before: dict[str, tuple[int, int]]

    def check(self, rpc: str) -> None:
        assert self.proc.poll() is None, f"server died during {rpc}: " + self.log.read_text()[-3000:]
        text = self.log.read_text(errors="replace")
        assert "Traceback" not in text, f"traceback after {rpc}: " + text[text.index("Traceback") - 2000 :][:6000]
        assert SECRET_MARKER not in text, f"a secret reached the log during {rpc}"
        assert snapshot(self.watched) == self.before, f"{rpc} changed something outside the server's roots"


def call(server: Server, stub: Any, rpc: str, request: Any, label: str, counts: Counter[str]) -> None:
    counts[label] += 1
    try:
        getattr(stub, rpc)(request, timeout=30)
    except grpc.RpcError as err:
        assert err.code() not in FORBIDDEN, f"{rpc}({request!r:.800}) -> {err.code().name}: {err.details()}"
    server.check(rpc)


@pytest.fixture(scope="module")
def csi_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root_with_loop()
    base = tmp_path_factory.mktemp("fuzz-csi")
    watched = watched_folder(base)
    sock, log = base / "csi.sock", base / "driver.log"
    (base / "kubelet").mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nvmeof_csi",
            "serve",
            "--mode",
            "all",
            "--backend",
            "loop",
            "--endpoint",
            f"unix://{sock}",
            "--state-dir",
            str(base / "state"),
            "--kubelet-root",
            str(base / "kubelet"),
            "--node-id",
            "fuzz-node",
            "--loop-capacity",
            "64G",
            "--log-level",
            "INFO",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    channel = grpc.insecure_channel(f"unix://{sock}")
    yield Server(proc, log, channel, watched, snapshot(watched))
    channel.close()
    proc.terminate()
    assert proc.wait(60) == 0, log.read_text()[-3000:]
    leftovers = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines() if str(base) in ln]
    for mount_point in reversed(leftovers):  # clean up what fuzzed valid requests left, then fail on it
        subprocess.run(["umount", "-l", mount_point], check=False)
    assert not leftovers, f"mounts left behind: {leftovers}"


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("fuzz-agent")
    watched = watched_folder(base)
    running = start_agent(base / "agent")
    channel = grpc.insecure_channel(running.unix)
    yield Server(running.proc, running.work / "agent.log", channel, watched, snapshot(watched))
    channel.close()
    running.proc.terminate()
    assert running.proc.wait(60) == 0


def _rpcs(service: Any) -> list[tuple[str, Any, Any]]:
    return [(m.name, m.input_type, m) for m in service.methods]


CSI_RPCS = [
    (s.name, name, inp)
    for s in csi_pb2.DESCRIPTOR.services_by_name.values()
    if s.name in ("Identity", "Controller", "Node")
    for name, inp, _ in _rpcs(s)
]
AGENT_RPCS = [(name, inp) for name, inp, _ in _rpcs(apb.DESCRIPTOR.services_by_name["Agent"])]
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(server: Server, stub: Any, module: Any, rpc: str, request_type: Any, label: str, counts: Counter[str]) -> None:
    """``FUZZ_EXAMPLES`` hostile ``rpc`` requests against ``server``, each checked by :func:`call`; at least
    one was sent."""
    requests = message(request_type, getattr(module, request_type.name), hostile_strings(server.watched))

    @FUZZ
    @given(requests)
    def run(request: Any) -> None:
        call(server, stub, rpc, request, label, counts)

    run()
    assert counts[label] > 0, f"no request was generated for {label}"


@pytest.mark.parametrize(("service", "rpc", "request_type"), CSI_RPCS, ids=[f"{s}.{r}" for s, r, _ in CSI_RPCS])
def test_csi_rpc_survives_hostile_requests(
    csi_server: Server, counts: Counter[str], service: str, rpc: str, request_type: Any
) -> None:
    stub = getattr(csi_pb2_grpc, f"{service}Stub")(csi_server.channel)
    fuzz(csi_server, stub, csi_pb2, rpc, request_type, f"csi.{service}.{rpc}", counts)


@pytest.mark.parametrize(("rpc", "request_type"), AGENT_RPCS, ids=[r for r, _ in AGENT_RPCS])
def test_agent_rpc_survives_hostile_requests(
    agent_server: Server, counts: Counter[str], rpc: str, request_type: Any
) -> None:
    fuzz(agent_server, apb_grpc.AgentStub(agent_server.channel), apb, rpc, request_type, f"agent.{rpc}", counts)
