"""Our target agent (``nvmeof-csi agent``) running inside the lab VM, on real configfs, with its state
and pool on the scratch disk (so they survive a guest reboot).

Contract: :meth:`GuestTargetAgent.start` returns once the agent answers on its socket (or raises
:class:`LabError` with the agent's log); :meth:`GuestTargetAgent.stop` sends a signal and waits for the
process to end. Commands against it (``ctl``, ``ops``) run our own code in the guest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from image.tlshd import ensure_tlshd
from lab.build import REPO
from lab.csi_client import AGENT_OPS_SOCK, Resident
from lab.fabric import Fabric, Portal
from lab.tlshd import start_tlshd
from lab.vm import GuestTimeout, LabError, LabVM, Pending

AGENT_SOCK = "/run/nvmeof-csi/agent.sock"
STATE_DIR = "/scratch/agent/state"
POOL_DIR = "/scratch/agent/pool"
LOG = "/scratch/agent/agent.log"
AGENT_METRICS = "127.0.0.1:9811"


class GuestProcess:
    """A long-running program of ours in the guest: started in the background, its PID in a file, its output
    appended to a log; ready when its unix socket exists."""

    def __init__(self, vm: LabVM, name: str, argv: Sequence[str], socket: str, log: str) -> None:
        self.vm, self.name, self.argv, self.socket, self.log = vm, name, list(argv), socket, log
        self.pidfile = f"/run/nvmeof-csi/{name}.pid"
        self._pending: Pending | None = None

    def start(self, timeout: float = 180) -> float:
        """Start; returns the seconds until its socket appeared (raises :class:`LabError` with the log)."""
        self.vm.mkdir("/run/nvmeof-csi")
        self.vm.mkdir(self.log.rsplit("/", 1)[0])
        begin = time.monotonic()
        wrapped = ["sh", "-c", f'echo $$ > {self.pidfile}; exec "$@" >>{self.log} 2>&1', self.name, *self.argv]
        self._pending = self.vm.submit(wrapped, timeout=3600, cwd=str(REPO))
        while time.monotonic() - begin < timeout:
            if self.vm.run(["test", "-S", self.socket], 10).rc == 0:
                return time.monotonic() - begin
            if self._pending.done():  # exited already
                break
            time.sleep(0.5)
        raise LabError(f"{self.name} did not start in {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.vm.run(["tail", "-n", "40", self.log], 10).out

    def stop(self, signal: str = "TERM", grace: float = 60) -> int:
        """Signal it (TERM: graceful; KILL: crash), wait (SIGKILL after ``grace`` s); returns the exit code."""
        if self._pending is None:
            return 0
        pid = self.vm.run(["cat", self.pidfile], 10).out.strip()
        if pid.isdigit():
            self.vm.run(["kill", f"-{signal}", pid], 10)
        try:
            rc = self._pending.wait(timeout=grace).rc
        except GuestTimeout:
            self.vm.run(["kill", "-KILL", pid], 10)
            rc = self._pending.wait(timeout=30).rc
        self._pending = None
        self.vm.run(["rm", "-f", self.socket, self.pidfile], 10)
        return rc


class GuestTargetAgent:
    def __init__(
        self,
        vm: LabVM,
        portals: Sequence[Portal],
        name: str = "lab",
        groups: Sequence[str] = (),
        extra_args: Sequence[str] = (),
    ) -> None:
        """``extra_args``: more ``nvmeof-csi agent`` flags (a TCP listener with TLS, an authz file)."""
        self.vm = vm
        self.extra_args = list(extra_args)
        self.name = name
        self.portals = list(portals)
        self.groups = list(groups) or ["a"] * len(self.portals)
        self._process: GuestProcess | None = None

    def argv(self, prune: bool = False) -> list[str]:
        argv = [
            self.vm.python,
            "-m",
            "nvmeof_csi",
            "agent",
            "--name",
            self.name,
            "--state-dir",
            STATE_DIR,
            "--pool-dir",
            POOL_DIR,
            "--listen-unix",
            f"unix://{AGENT_SOCK}",
            "--grace-seconds",
            "5",
            "--metrics-listen",
            AGENT_METRICS,
        ]
        for portal, group in zip(self.portals, self.groups, strict=True):
            tls = ":tls" if portal.tls else ""
            argv += ["--portal", f"{portal.port_id}:{portal.trtype}:{portal.traddr}:{portal.trsvcid}:{group}{tls}"]
        return [*argv, *self.extra_args, *(["--prune"] if prune else [])]

    def start(self, prune: bool = False, timeout: float = 180) -> float:
        """Start the agent; returns seconds until it answered."""
        self._process = GuestProcess(self.vm, "agent", self.argv(prune), AGENT_SOCK, LOG)
        return self._process.start(timeout)

    def log_tail(self) -> str:
        return self._process.log_tail() if self._process else ""

    def stop(self, signal: str = "TERM", grace: float = 60) -> int:
        """Signal the agent (TERM: graceful; KILL: crash) and wait for it to end; returns its exit code."""
        return self._process.stop(signal, grace) if self._process else 0

    def ctl(self, *args: str, timeout: float = 120) -> Any:
        """``nvmeofctl --agent ... -o json ARGS`` in the guest; returns the parsed JSON."""
        out = self.vm.check(
            [self.vm.python, "-m", "nvmeof_csi.cli.main", "--agent", f"unix://{AGENT_SOCK}", "-o", "json", *args],
            timeout=timeout,
        )
        return json.loads(out)

    def ops(self, *args: str, timeout: float = 300) -> Any:
        """One ``lab.agent_ops`` call in the guest, through the VM's resident server of them (one Python start
        per VM, not per call)."""
        return agent_ops_client(self.vm).call(list(args), f"agent_ops {' '.join(args[:2])}", timeout)

    def wipe(self) -> None:
        """Forget everything (state, pool, replicas' DRBD resources, the read-only subsystems' dm maps and loop
        devices) -- between tests only, with the agent stopped and its subsystems gone."""
        drop = (
            f'for f in {STATE_DIR}/drbd/nv-*.res; do [ -e "$f" ] && /usr/lib/drbd/drbdsetup-84 down '
            '"$(basename "$f" .res)"; done; rm -rf /dev/nvmeof-csi; '
            "for m in $(dmsetup ls 2>/dev/null | awk '/^nvmeof-ro-/{print $1}'); do dmsetup remove --retry $m; done; "
            "for l in $(losetup --noheadings --output NAME,BACK-FILE 2>/dev/null "
            "| awk '$2 ~ \"^/scratch/agent/\"{print $1}'); do losetup --detach $l; done; true"
        )
        self.vm.run(["sh", "-c", drop], 60)
        self.vm.run(["rm", "-rf", "/scratch/agent"], 60)


FABRIC_MAP = "/run/nvmeof-csi/fabric.yaml"
TWO_PORTALS = (Portal(1, "tcp", "127.0.0.1", 4420), Portal(2, "tcp", "127.0.0.2", 4421))


#: soft-RoCE portals, each on its own dummy netdev and rxe device (so a path can be black-holed by address)
TWO_RDMA_PORTALS = (Portal(3, "rdma", "169.254.77.1", 4420), Portal(4, "rdma", "169.254.77.2", 4421))
RXE_NETDEVS = ("rdum1", "rdum2")
#: NVMe/TCP portals that require TLS 1.3 (``tls: psk`` volumes only; groups a and b)
TWO_TLS_PORTALS = (Portal(5, "tcp", "127.0.0.3", 4430, tls=True), Portal(6, "tcp", "127.0.0.4", 4431, tls=True))


def setup_rdma_portals(vm: LabVM) -> None:
    """The soft-RoCE devices behind :data:`TWO_RDMA_PORTALS` (inside the NIC-less VM); idempotent."""
    for ifname, portal in zip(RXE_NETDEVS, TWO_RDMA_PORTALS, strict=True):
        Fabric(vm).setup_rxe(ifname, (portal.traddr,))


@contextmanager
def running_agent(vm: LabVM, fabric: str = "lab", rdma: bool = False, tls: bool = False) -> Iterator[GuestTargetAgent]:
    """A fresh agent with two TCP portals (groups a and b) -- with ``rdma`` also two soft-RoCE portals, with ``tls``
    two TLS portals and a running tlshd (groups a and b each) -- and a fabric map naming it at ``FABRIC_MAP``;
    afterwards the agent is stopped and configfs, controllers and its state are wiped."""
    lab_fabric = Fabric(vm)
    lab_fabric.clear()
    portals = [*TWO_PORTALS, *(TWO_RDMA_PORTALS if rdma else ()), *(TWO_TLS_PORTALS if tls else ())]
    if rdma:
        setup_rdma_portals(vm)
    if tls:
        start_tlshd(vm, ensure_tlshd())
    agent = GuestTargetAgent(vm, portals, groups=["a", "b"] * (len(portals) // 2))
    agent.wipe()
    agent.start()
    transports = "[tcp, rdma]" if rdma else "[tcp]"
    vm.write(
        FABRIC_MAP,
        f"agents:\n  - {{name: {agent.name}, endpoint: 'unix://{AGENT_SOCK}', fabric: {fabric}, "
        f"transports: {transports}}}\n",
    )
    try:
        yield agent
    finally:
        agent.stop()
        lab_fabric.clear()
        agent.wipe()


def agent_ops_client(vm: LabVM) -> Resident:
    """``vm``'s resident server of :mod:`lab.agent_ops` calls (made at the first use)."""
    found = vm.residents.get(AGENT_OPS_SOCK)
    if not isinstance(found, Resident):
        found = vm.residents[AGENT_OPS_SOCK] = Resident(vm, "agent", AGENT_SOCK, AGENT_OPS_SOCK)
    return found
