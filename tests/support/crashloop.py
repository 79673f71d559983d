"""Crash loop for the target agent: random creates and deletes while the agent is SIGKILLed at random
moments and restarted; afterwards state, configfs and pool must agree and every surviving volume's data
must be intact. Used on the host (plain configfs tree) and in the lab VM (real configfs).

usage: python -m tests.support.crashloop WORKDIR [--ops 200] [--min-kills 0] [--seed 1] [--configfs ROOT]
       [--plain-tree] [--kill-every MIN_S MAX_S]
At least ``--ops`` operations, and more until the agent was killed ``--min-kills`` times (a faster agent must
not make the loop end before it crashed often enough; at most 20x ``--ops``). Prints one JSON report line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.state import StateStore
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.errors import DriverError, Unavailable
from nvmeof_csi.nvmeof.nqn import volume_nqn
from nvmeof_csi.rpc.endpoints import Endpoint

MiB = 1 << 20


class AgentProcess:
    def __init__(self, work: Path, configfs: Path, plain: bool) -> None:
        self.work, self.configfs, self.plain = work, configfs, plain
        self.sock = work / "agent.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned = threading.Event()
        self.ready = threading.Event()
        self.log = open(work / "agent.log", "ab")  # noqa: SIM115 - closed in stop()

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "nvmeof_csi",
            "agent",
            "--name",
            "crash",
            "--portal",
            "1:tcp:127.0.0.1:4420:a",
            "--state-dir",
            str(self.work / "state"),
            "--pool-dir",
            str(self.work / "pool"),
            "--listen-unix",
            f"unix://{self.sock}",
            "--configfs-root",
            str(self.configfs),
            "--log-level",
            "WARNING",
        ]
        if self.plain:
            argv.append("--configfs-plain-tree")
        self.ready.clear()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        self.spawned.set()
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited rc={self.proc.returncode}; see {self.work / 'agent.log'}")
            if self.sock.exists():
                try:
                    with AgentClient(AgentTarget("crash", Endpoint.parse(f"unix://{self.sock}")), 5) as c:
                        c.health()
                        self.ready.set()
                        return
                except DriverError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("agent did not come up")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        self.log.close()


def _sign(work: Path, vol_uuid: str) -> None:
    """The volume's "data": its UUID at offset 1 MiB, written once."""
    with open(work / "pool" / "volumes" / f"{vol_uuid}.img", "r+b") as f:
        f.seek(MiB)
        if f.read(36) != vol_uuid.encode():
            f.seek(MiB)
            f.write(vol_uuid.encode())


class Killer(threading.Thread):
    """SIGKILLs the agent at random moments until stopped: mostly while it serves (LOW..HIGH seconds after it
    became ready, so every life does some work), sometimes while it starts and converges."""

    def __init__(self, agent: AgentProcess, rng: random.Random, low: float, high: float) -> None:
        super().__init__(daemon=True)
        self.agent, self.rng, self.low, self.high = agent, rng, low, high
        self.done = threading.Event()
        self.kills = 0
        self.kills_while_starting = 0

    def run(self) -> None:
        while not self.done.is_set():
            early = self.rng.random() < 0.2
            gate = self.agent.spawned if early else self.agent.ready
            while not gate.wait(0.2):
                if self.done.is_set():
                    return
            delay = self.rng.uniform(0, self.low) if early else self.rng.uniform(self.low, self.high)
            if self.done.wait(delay):
                return
            proc = self.agent.proc
            if proc is not None and proc.poll() is None:
                starting = not self.agent.ready.is_set()
                self.agent.spawned.clear()
                self.agent.ready.clear()
                proc.send_signal(signal.SIGKILL)
                self.kills += 1
                self.kills_while_starting += starting


def ensure_running(agent: AgentProcess) -> None:
    while agent.proc is None or agent.proc.poll() is not None:
        try:
            agent.start()
        except RuntimeError:
            continue  # killed while starting (converging): start again


def run(
    work: Path,
    ops: int,
    seed: int,
    configfs: Path,
    plain: bool,
    kill_every: tuple[float, float],
    min_kills: int = 0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    agent = AgentProcess(work, configfs, plain)
    ensure_running(agent)
    target = AgentTarget("crash", Endpoint.parse(f"unix://{agent.sock}"))
    expected: dict[str, str] = {}  # name -> uuid of the volumes that must exist
    interrupted = 0
    killer = Killer(agent, rng, *kill_every)
    killer.start()
    done = 0
    while done < ops or (killer.kills < min_kills and done < 20 * ops):
        done += 1
        name = f"vol-{rng.randrange(30)}"
        while True:  # every operation is idempotent: after a crash, restart the agent and repeat it
            ensure_running(agent)
            try:
                with AgentClient(target, 60) as client:
                    if name in expected:
                        client.delete_volume(expected[name])
                        del expected[name]
                    else:
                        expected[name] = client.create_volume(name, 4 * MiB, {"queueSize": "64"}).uuid
                        _sign(work, expected[name])
                break
            except Unavailable:
                interrupted += 1
    killer.done.set()
    killer.join()
    ensure_running(agent)
    agent.stop()
    agent = AgentProcess(work, configfs, plain)  # one clean restart: converge must change nothing
    before = Nvmet(configfs, plain_tree=plain).dump()
    agent.start()
    agent.stop()
    state = StateStore(work / "state").current
    nvmet = Nvmet(configfs, plain_tree=plain)
    names = {v.name: v.uuid for v in state.volumes.values()}
    files = sorted(p.name for p in (work / "pool" / "volumes").iterdir())
    corrupt = []
    for vol_uuid in names.values():
        with open(work / "pool" / "volumes" / f"{vol_uuid}.img", "rb") as f:
            f.seek(MiB)
            if f.read(36) != vol_uuid.encode():
                corrupt.append(vol_uuid)
    return {
        "ops": done,
        "kills": killer.kills,
        "kills_while_starting": killer.kills_while_starting,
        "interrupted_rpcs": interrupted,
        "expected_names": sorted(expected),
        "state_names": sorted(names),
        "statuses": sorted({v.status for v in state.volumes.values()}),
        "subsystems_match": sorted(nvmet.subsystems()) == sorted(volume_nqn(u) for u in names.values()),
        "files_match": files == sorted(f"{u}.img" for u in names.values()),
        "links_match": sorted(nvmet.linked(1)) == sorted(volume_nqn(u) for u in names.values()),
        "restart_changed_configfs": nvmet.dump() != before,
        "corrupt": corrupt,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--min-kills", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--configfs", type=Path)
    ap.add_argument("--plain-tree", action="store_true")
    ap.add_argument("--kill-every", type=float, nargs=2, default=(0.05, 0.6), metavar=("MIN_S", "MAX_S"))
    a = ap.parse_args()
    configfs = a.configfs or a.work / "nvmet"
    if a.plain_tree:
        for sub in ("subsystems", "ports", "hosts"):
            (configfs / sub).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(json.dumps(run(a.work, a.ops, a.seed, configfs, a.plain_tree, tuple(a.kill_every), a.min_kills)))


if __name__ == "__main__":
    main()
