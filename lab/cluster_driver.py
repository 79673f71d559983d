"""The driver across the lab cluster (``lab/cluster.py``): our target agent on ``storage-1``, its portals on both
fabric links (group ``a`` on ``fa``, ``b`` on ``fb``) and its API on the management link behind mutual TLS, and
``nvmeof-csi serve --mode all`` on each GPU node, whose controller reaches the agent over ``mgmt`` and whose node
plugin connects over ``fa`` and ``fb``. Each GPU node is driven through CSI gRPC by ``lab.csi_ops`` in its own VM.

Contract: :func:`running_cluster_driver` yields once the agent and both drivers answer; afterwards every driver and
the agent are stopped, every controller disconnected and every mount released, and the agent's state wiped.
The PKI comes from the caller (``pki``: ``ca.crt``, ``srv.crt``/``srv.key`` for the agent with the agent's
management address in its names, ``ctrl.crt``/``ctrl.key`` for the drivers, whose common name is ``identity``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lab.build import REPO
from lab.cluster import LabCluster
from lab.fabric import Fabric, Portal, wait_until
from lab.stack import GuestDriver
from lab.target import FABRIC_MAP, GuestTargetAgent
from lab.vm import LabError, LabVM

AGENT_PORT = 9440
#: each storage node's controller IDs: one volume on two nodes is one subsystem to the host, whose controllers'
#: IDs must differ (nvmet's default window is the whole range on both)
CNTLID_WINDOWS = {"storage-1": "1-999", "storage-2": "1000-1999"}
#: the replicas' self-fence: longer than the replication tests take to answer a fence-peer call as the controller
#: (each answer is a guest Python start, seconds under TCG), shorter than they wait for it
SELF_FENCE_AFTER = "15"
PKI = "/scratch/pki"  # on the scratch disk: a machine that lost its power keeps its keys
STORAGE, GPUS = "storage-1", ("gpu-1", "gpu-2")


@dataclass
class ClusterDriver:
    cluster: LabCluster
    agent: GuestTargetAgent
    drivers: dict[str, GuestDriver]

    def restart_storage(self) -> tuple[float, float]:
        """After :meth:`LabCluster.power_cut` of ``storage-1``: boot it, load its modules and start the agent again
        (what its service manager would do); (boot seconds, agent start seconds). The agent restores configfs
        from its saved state."""
        booted = self.cluster.boot(STORAGE)
        Fabric(self.cluster.vm(STORAGE)).load()
        started = self.agent.start()
        for name in GPUS:
            _await_agent(self.cluster.vm(name))
        return booted, started

    def backing_sha256(self, vol_uuid: str) -> str:
        """The sha256 of a volume's backing file on ``storage-1``."""
        vm = self.cluster.vm(STORAGE)
        path = self.agent.ctl("volumes", "show", vol_uuid)[0]["backing_file"]
        return vm.check(["sha256sum", path], timeout=120).split()[0]


def _install(vm: LabVM, files: Mapping[str, Path]) -> None:
    vm.mkdir(PKI)
    for name, source in files.items():
        vm.write(f"{PKI}/{name}", source.read_text())
        vm.check(["chmod", "600", f"{PKI}/{name}"])


def portals(cluster: LabCluster, node: str = STORAGE) -> list[Portal]:
    """``node``'s two portals: group ``a`` on ``fa``, ``b`` on ``fb``."""
    return [
        Portal(1, "tcp", cluster.address(node, "fa"), 4420),
        Portal(2, "tcp", cluster.address(node, "fb"), 4420),
    ]


TARGETS = "/run/nvmeof-csi/targets.yaml"


def _await_agent(vm: LabVM, timeout: float = 180) -> None:
    """Until the agent answers ``vm`` over the management link with mutual TLS (``nvmeofctl health``)."""
    argv = [vm.python, "-m", "nvmeof_csi.cli.main", "--targets", TARGETS, "-o", "json", "health"]
    last: list[str] = []

    def answers() -> bool:
        res = vm.run(argv, 60, cwd=str(REPO))
        last[:] = [res.out[-500:], res.err[-1000:]]
        return res.rc == 0

    if not wait_until(answers, timeout, 2):
        raise LabError(f"{STORAGE}'s agent does not answer {vm.ready.get('hostnqn')} over mTLS: {last}")


@contextmanager
def running_cluster_driver(
    cluster: LabCluster, pki: Mapping[str, Path], identity: str, driver_args: Sequence[str] = ()
) -> Iterator[ClusterDriver]:
    """``driver_args``: more ``serve`` flags for both drivers."""
    storage = cluster.vm(STORAGE)
    _install(storage, {"ca.crt": pki["ca.crt"], "tls.crt": pki["srv.crt"], "tls.key": pki["srv.key"]})
    storage.write(f"{PKI}/authz.yaml", f"clients:\n  - {{identity: {identity}, role: controller}}\n")
    listen = f"tcp://{cluster.address(STORAGE, 'mgmt')}:{AGENT_PORT}"
    tls = ["--tls-cert", f"{PKI}/tls.crt", "--tls-key", f"{PKI}/tls.key", "--tls-ca", f"{PKI}/ca.crt"]
    replication = ["--replication-address", cluster.address(STORAGE, "fa"), "--cntlid-window", CNTLID_WINDOWS[STORAGE],
                   "--self-fence-after", SELF_FENCE_AFTER]  # fmt: skip
    agent = GuestTargetAgent(
        storage, portals(cluster), name=STORAGE, groups=["a", "b"],
        extra_args=["--listen-tcp", listen, *tls, "--authz-file", f"{PKI}/authz.yaml", *replication],
    )  # fmt: skip
    for vm in cluster.vms.values():
        Fabric(vm).clear()
    agent.wipe()
    agent.start()
    drivers: dict[str, GuestDriver] = {}
    try:
        for name in GPUS:
            vm = cluster.vm(name)
            _install(vm, {"ca.crt": pki["ca.crt"], "tls.crt": pki["ctrl.crt"], "tls.key": pki["ctrl.key"]})
            vm.mkdir(FABRIC_MAP.rsplit("/", 1)[0])
            client_tls = f"tls: {{cert: {PKI}/tls.crt, key: {PKI}/tls.key, ca: {PKI}/ca.crt}}"
            vm.write(
                FABRIC_MAP,
                f"agents:\n  - {{name: {STORAGE}, endpoint: '{listen}', fabric: lab, transports: [tcp],\n"
                f"     {client_tls}}}\n",
            )
            vm.write(TARGETS, f"targets:\n  - {{name: {STORAGE}, endpoint: '{listen}', {client_tls}}}\n")
            _await_agent(vm)
            drivers[name] = GuestDriver(vm, agent, extra_args=driver_args)
            drivers[name].release()
            drivers[name].start()
        yield ClusterDriver(cluster, agent, drivers)
    finally:
        for driver in drivers.values():
            driver.stop()
            driver.release()
            Fabric(driver.vm).disconnect_all()
        agent.stop()
        Fabric(storage).clear()
        agent.wipe()
