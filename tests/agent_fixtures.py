"""Shared set-up for agent tests on the host: a plain folder standing in for nvmet configfs."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.nvmeof.target.configfs import Nvmet, PortSpec
from nvmeof_csi.nvmeof.target.service import TargetAgent
from nvmeof_csi.nvmeof.target.state import StateStore
from nvmeof_csi.nvmeof.target.store import FileStore

PORTALS = (PortSpec(1, "tcp", "127.0.0.1", 4420, "a"), PortSpec(2, "tcp", "127.0.0.2", 4421, "b"))


def plain_configfs(root: Path) -> Path:
    for sub in ("subsystems", "ports", "hosts"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


def make_agent(tmp: Path, capacity: int = 0) -> TargetAgent:
    return TargetAgent(
        name="store-a",
        nvmet=Nvmet(plain_configfs(tmp / "nvmet"), plain_tree=True),
        store=FileStore(tmp / "pool"),
        state=StateStore(tmp / "state" / "agent-state.json"),
        portals=PORTALS,
        capacity_limit=capacity,
    )


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    work: Path
    unix: str
    tcp: str = ""


def start_agent(work: Path, extra: Sequence[str] = (), name: str = "store-a", ports: Sequence[str] = ()) -> Running:
    """``nvmeof-csi agent`` as a process on a plain configfs tree under ``work``; returns once it listens."""
    work.mkdir(parents=True, exist_ok=True)
    sock = work / "agent.sock"
    portals = ports or ("1:tcp:127.0.0.1:4420:a", "2:tcp:127.0.0.2:4421:b")
    argv = [sys.executable, "-m", "nvmeof_csi", "agent", "--name", name, *(x for p in portals for x in ("--portal", p)),
            "--state-dir", str(work / "state"), "--pool-dir", str(work / "pool"),
            "--listen-unix", f"unix://{sock}", "--configfs-root", str(plain_configfs(work / "nvmet")),
            "--configfs-plain-tree", *extra]
    log = open(work / "agent.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None, (work / "agent.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return Running(proc, work, f"unix://{sock}")
