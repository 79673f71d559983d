"""The whole driver in the lab VM: our target agent (real configfs), and ``nvmeof-csi serve --mode all
--backend nvmeof`` (controller + node on the kernel initiator), driven through CSI gRPC by ``lab.csi_ops``.

Contract: :func:`running_stack` yields a :class:`GuestDriver` whose agent and driver answer on their sockets;
on exit both are stopped, every controller disconnected, every mount under the lab work folder released and
configfs and the agent's state wiped. :meth:`GuestDriver.csi` runs a batch of CSI steps through the VM's
resident CSI client (:mod:`lab.csi_client`) and returns their results (raises :class:`lab.vm.GuestError` with
the gRPC code on a failed RPC).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lab.csi_client import CsiClient
from lab.fabric import Fabric
from lab.target import FABRIC_MAP, GuestProcess, GuestTargetAgent, running_agent
from lab.vm import LabVM

DRIVER_SOCK = "/run/nvmeof-csi/driver.sock"
DRIVER_LOG = "/scratch/agent/driver.log"
NODE_STATE = "/scratch/agent/node"
#: kubelet's root stand-in: the CSI ops (csi_ops.WORK) and the csi-sanity runs keep their paths under it
KUBELET_ROOT = "/run/nvmeof-csi/lab"
WORK = "/run/nvmeof-csi/lab"
QOS_PERIOD = 1.0  # the node's limits reconcile period in the lab (the default is 5 s)
DRIVER_METRICS = "127.0.0.1:9810"  # /metrics of the driver (controller + node) and of the agent (lab.target)


class GuestDriver:
    def __init__(
        self, vm: LabVM, agent: GuestTargetAgent, log_level: str = "INFO", extra_args: Sequence[str] = ()
    ) -> None:
        self.vm, self.agent = vm, agent
        self.client = CsiClient(vm, DRIVER_SOCK)
        self.process = GuestProcess(
            vm,
            "driver",
            [
                vm.python,
                "-m",
                "nvmeof_csi",
                "serve",
                "--mode",
                "all",
                "--backend",
                "nvmeof",
                "--fabric-map",
                FABRIC_MAP,
                "--fabric",
                "lab",
                "--endpoint",
                f"unix://{DRIVER_SOCK}",
                "--state-dir",
                NODE_STATE,
                "--max-volumes-per-node",
                "8",
                "--log-level",
                log_level,
                "--kubelet-root",
                KUBELET_ROOT,
                "--metrics-listen",
                DRIVER_METRICS,
                "--qos-period",
                str(QOS_PERIOD),
                *extra_args,
            ],
            DRIVER_SOCK,
            DRIVER_LOG,
        )

    def start(self) -> float:
        return self.process.start()

    def stop(self, signal: str = "TERM") -> int:
        return self.process.stop(signal)

    def restart_after_kill(self) -> float:
        """SIGKILL the driver (a crash: no clean-up runs), then start it again; returns the start seconds."""
        self.process.stop("KILL")
        return self.process.start()

    def csi(self, *steps: dict[str, Any], timeout: float = 900) -> list[dict[str, Any]]:
        return self.client.batch(list(steps), timeout)

    def one(self, op: str, name: str, **args: Any) -> dict[str, Any]:
        return self.csi({"op": op, "name": name, **args})[0]

    def log_tail(self) -> str:
        return self.process.log_tail()

    def mounts(self) -> list[str]:
        """Mount points under the lab work folder (what a leak would leave behind)."""
        return [line.split()[1] for line in self.vm.read("/proc/mounts").splitlines() if f" {WORK}/" in line]

    def release(self) -> None:
        """Best-effort clean-up of anything a failed test left: mounts, controllers, the ledger."""
        for mount_point in sorted(self.mounts(), reverse=True):
            self.vm.run(["umount", "-l", mount_point], 30)
        self.vm.run(["rm", "-rf", WORK, NODE_STATE], 30)


@contextmanager
def running_stack(vm: LabVM, log_level: str = "INFO", rdma: bool = False, tls: bool = False) -> Iterator[GuestDriver]:
    """The agent (with ``rdma``: also two soft-RoCE portals, set up before the driver starts so that its node
    reports ``transport-rdma``) and the driver."""
    with running_agent(vm, rdma=rdma, tls=tls) as agent:
        driver = GuestDriver(vm, agent, log_level)
        driver.release()
        driver.start()
        try:
            yield driver
        finally:
            driver.stop()
            driver.release()
            Fabric(vm).disconnect_all()
