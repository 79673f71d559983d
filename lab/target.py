"""Our target agent (``nvmeof-csi agent``) running inside the lab VM, on real configfs, with its state
and pool on the scratch disk (so they survive a guest reboot).

Contract: :meth:`GuestTargetAgent.start` returns once the agent answers on its socket (or raises
:class:`LabError` with the agent's log); :meth:`GuestTargetAgent.stop` sends a signal and waits for the
process to end. Commands against it (``ctl``, ``ops``) run our own code in the guest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from lab.build import REPO
from lab.fabric import Portal
from lab.vm import GuestTimeout, LabError, LabVM, Pending

AGENT_SOCK = "/run/nvmeof-csi/agent.sock"
STATE_DIR = "/scratch/agent/state"
POOL_DIR = "/scratch/agent/pool"
LOG = "/scratch/agent/agent.log"
PIDFILE = "/run/nvmeof-csi/agent.pid"


class GuestTargetAgent:
    def __init__(self, vm: LabVM, portals: Sequence[Portal], name: str = "lab", groups: Sequence[str] = ()) -> None:
        self.vm = vm
        self.name = name
        self.portals = list(portals)
        self.groups = list(groups) or ["a"] * len(self.portals)
        self._pending: Pending | None = None

    def argv(self, prune: bool = False) -> list[str]:
        argv = [self.vm.python, "-m", "nvmeof_csi", "agent", "--name", self.name, "--state-dir", STATE_DIR,
                "--pool-dir", POOL_DIR, "--listen-unix", f"unix://{AGENT_SOCK}", "--grace-seconds", "5"]
        for portal, group in zip(self.portals, self.groups, strict=True):
            argv += ["--portal", f"{portal.port_id}:{portal.trtype}:{portal.traddr}:{portal.trsvcid}:{group}"]
        return [*argv, *(["--prune"] if prune else [])]

    def start(self, prune: bool = False, timeout: float = 180) -> float:
        """Start the agent; returns seconds until it answered."""
        self.vm.mkdir("/scratch/agent")
        start = time.monotonic()
        self.vm.mkdir("/run/nvmeof-csi")
        wrapped = ["sh", "-c", f'echo $$ > {PIDFILE}; exec "$@" >>{LOG} 2>&1', "agent", *self.argv(prune)]
        self._pending = self.vm.submit(wrapped, timeout=3600)
        while time.monotonic() - start < timeout:
            if self.vm.run(["test", "-S", AGENT_SOCK], 10).rc == 0:
                return time.monotonic() - start
            time.sleep(0.5)
        raise LabError(f"agent did not start in {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.vm.run(["tail", "-n", "40", LOG], 10).out

    def stop(self, signal: str = "TERM", grace: float = 60) -> int:
        """Signal the agent (TERM: graceful; KILL: crash) and wait for it to end (SIGKILL after ``grace``
        seconds); returns its exit code."""
        if self._pending is None:
            return 0
        pid = self.vm.run(["cat", PIDFILE], 10).out.strip()
        if pid.isdigit():
            self.vm.run(["kill", f"-{signal}", pid], 10)
        try:
            rc = self._pending.wait(timeout=grace).rc
        except GuestTimeout:
            self.vm.run(["kill", "-KILL", pid], 10)
            rc = self._pending.wait(timeout=30).rc
        self._pending = None
        self.vm.run(["rm", "-f", AGENT_SOCK, PIDFILE], 10)
        return rc

    def ctl(self, *args: str, timeout: float = 120) -> Any:
        """``nvmeofctl --agent ... -o json ARGS`` in the guest; returns the parsed JSON."""
        out = self.vm.check([self.vm.python, "-m", "nvmeof_csi.cli.main", "--agent", f"unix://{AGENT_SOCK}",
                             "-o", "json", *args], timeout=timeout)
        return json.loads(out)

    def ops(self, *args: str, timeout: float = 300) -> Any:
        """One ``tests.lab_agent.guest_ops`` call in the guest (several agent operations in one process)."""
        out = self.vm.check([self.vm.python, "-m", "tests.lab_agent.guest_ops", AGENT_SOCK, *args], timeout=timeout,
                            cwd=str(REPO))
        return json.loads(out.strip().splitlines()[-1])

    def wipe(self) -> None:
        """Forget everything (state and pool) -- between tests only, with the agent stopped."""
        self.vm.run(["rm", "-rf", "/scratch/agent"], 60)

