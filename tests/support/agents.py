"""Shared set-up for agent tests on the host: a plain folder standing in for nvmet configfs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.messages import reservation_msg, snapshot_msg, volume_msg, volume_with_health
from nvmeof_csi.agent.names import Reservation
from nvmeof_csi.agent.pool import FileStore
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.readonly import PlainReadOnlyDevices
from nvmeof_csi.agent.replica_spec import ReplicaSpec
from nvmeof_csi.agent.state import StateStore
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.parameters import VolumeParameters

PORTALS = (PortSpec(1, "tcp", "127.0.0.1", 4420, "a"), PortSpec(2, "tcp", "127.0.0.2", 4421, "b"))


def plain_configfs(root: Path) -> Path:
    for sub in ("subsystems", "ports", "hosts"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


def make_agent(
    tmp: Path,
    capacity: int = 0,
    name: str = "store-a",
    clock: Callable[[], float] = time.time,
) -> TargetAgent:
    return TargetAgent(
        name=name,
        nvmet=Nvmet(plain_configfs(tmp / "nvmet"), plain_tree=True),
        store=FileStore(tmp / "pool"),
        state=StateStore(tmp / "state"),
        portals=PORTALS,
        capacity_limit=capacity,
        clock=clock,
        readonly_devices=PlainReadOnlyDevices(),
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
    argv = [
        sys.executable,
        "-m",
        "nvmeof_csi",
        "agent",
        "--name",
        name,
        *(x for p in portals for x in ("--portal", p)),
        "--state-dir",
        str(work / "state"),
        "--pool-dir",
        str(work / "pool"),
        "--listen-unix",
        f"unix://{sock}",
        "--configfs-root",
        str(plain_configfs(work / "nvmet")),
        "--configfs-plain-tree",
        *extra,
    ]
    log = open(work / "agent.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    tcp = [extra[i + 1] for i, arg in enumerate(extra[:-1]) if arg == "--listen-tcp"]
    while not (sock.exists() and all(_accepts(url) for url in tcp)):  # every listener, not only the first bound
        assert proc.poll() is None, (work / "agent.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return Running(proc, work, f"unix://{sock}")


def _accepts(url: str) -> bool:
    """A TCP connection to ``tcp://HOST:PORT`` is accepted (the agent listens there)."""
    host, _, port = url.removeprefix("tcp://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


class LocalAgent:
    """The ``AgentApi`` of the controller's backend over an in-process :class:`TargetAgent` (no gRPC): real
    agent logic on a plain configfs tree, for component tests. ``free`` overrides the reported capacity."""

    def __init__(self, agent: TargetAgent, free: int | None = None) -> None:
        self.agent = agent
        self.free = free
        self.before_create: Callable[[], None] = lambda: None
        self.before_reserve: Callable[[], None] = lambda: None

    def health(self) -> pb.HealthResponse:
        rep = self.agent.replication
        return pb.HealthResponse(
            ready=True,
            agent_name=self.agent.name,
            replication_address=rep.address if rep is not None else "",
            replication_host=rep.host if rep is not None else "",
        )

    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        source_volume: str = "",
        source_snapshot: str = "",
        timeout: float | None = None,
        vol_uuid: str = "",
        replica: Mapping[str, str] | None = None,
    ) -> pb.Volume:
        self.before_create()
        view = self.agent.create_volume(
            name,
            capacity_bytes,
            VolumeParameters.parse(parameters or {}),
            dict(labels or {}),
            source_volume,
            source_snapshot,
            vol_uuid,
            ReplicaSpec.parse(replica) if replica else None,
        )
        return volume_msg(view)

    def set_replica_role(self, vol_uuid: str, role: str, epoch: int, timeout: float | None = None) -> pb.Volume:
        return volume_msg(self.agent.set_replica_role(vol_uuid, role, epoch))

    def reserve_name(self, name: str, vol_uuid: str, agent: str) -> pb.Reservation:
        self.before_reserve()
        return reservation_msg(self.agent.reserve_name(Reservation(name, vol_uuid, agent)))

    def lookup_name(self, name: str) -> pb.Reservation | None:
        kept = self.agent.lookup_name(name)
        return reservation_msg(kept) if kept is not None else None

    def release_name(self, name: str, vol_uuid: str) -> None:
        self.agent.release_name(name, vol_uuid)

    def delete_volume(self, vol_uuid: str) -> None:
        self.agent.delete_volume(vol_uuid)

    def resize_volume(self, vol_uuid: str, capacity_bytes: int) -> pb.Volume:
        return volume_msg(self.agent.resize_volume(vol_uuid, capacity_bytes))

    def modify_volume(self, vol_uuid: str, parameters: Mapping[str, str]) -> pb.Volume:
        return volume_msg(self.agent.modify_volume(vol_uuid, parameters))

    def get_volume(self, vol_uuid: str = "", name: str = "") -> pb.Volume:
        return volume_with_health(self.agent, self.agent.get_volume(vol_uuid, name))

    def list_volumes(self) -> list[pb.Volume]:
        return [volume_msg(v) for v in self.agent.list_volumes()]

    def create_snapshot(self, name: str, source_volume: str) -> pb.Snapshot:
        return snapshot_msg(self.agent.create_snapshot(name, source_volume))

    def delete_snapshot(self, snap_uuid: str) -> None:
        self.agent.delete_snapshot(snap_uuid)

    def list_snapshots(self, source_volume: str = "", snapshot_uuid: str = "") -> list[pb.Snapshot]:
        return [snapshot_msg(s) for s in self.agent.list_snapshots(source_volume, snapshot_uuid)]

    def allow_host(
        self,
        vol_uuid: str,
        host_nqn: str,
        secret: str = "",
        readonly: bool = False,
        ctrl_secret: str = "",
        node_name: str = "",
    ) -> pb.Volume:
        return volume_msg(self.agent.allow_host(vol_uuid, host_nqn, secret, readonly, ctrl_secret, node_name))

    def get_host_keys(self, vol_uuid: str, host_nqn: str) -> pb.HostKeys:
        key, ctrl_key, psk = self.agent.host_keys(vol_uuid, host_nqn)
        return pb.HostKeys(dhchap_secret=key, dhchap_ctrl_secret=ctrl_key, tls_psk=psk)

    def deny_host(self, vol_uuid: str, host_nqn: str) -> pb.Volume:
        return volume_msg(self.agent.deny_host(vol_uuid, host_nqn))

    def fence_host(self, vol_uuid: str, host_nqn: str, reason: str, boot_id: str = "") -> pb.Volume:
        return volume_msg(self.agent.fence_host(vol_uuid, host_nqn, reason, boot_id))

    def unfence_host(self, vol_uuid: str, host_nqn: str) -> pb.Volume:
        return volume_msg(self.agent.unfence_host(vol_uuid, host_nqn))

    def capacity(self) -> list[pb.Pool]:
        total = self.agent.capacity_bytes()
        free = self.free if self.free is not None else total - self.agent.provisioned_bytes()
        return [
            pb.Pool(name="pool", total_bytes=total, free_bytes=free, provisioned_bytes=self.agent.provisioned_bytes())
        ]


def local_agents(
    tmp: Path,
    names: Sequence[str],
    capacity: int = 1 << 40,
    clocks: Mapping[str, Callable[[], float]] | None = None,
) -> dict[str, LocalAgent]:
    agents = {}
    for name in names:
        agent = make_agent(tmp / name, capacity, name, (clocks or {}).get(name, time.time))
        agent.converge()
        agents[name] = LocalAgent(agent)
    return agents
