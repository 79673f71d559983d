"""Shared set-up for agent tests on the host: a plain folder standing in for nvmet configfs."""

from __future__ import annotations

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
