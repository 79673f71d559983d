"""The target agent of one storage node: volumes, snapshots, clones, host grants and ANA over the kernel's
nvmet configfs tree and a backing-file pool, with durable desired state.

:class:`TargetAgent` is the facade the API servicer and the tests call; the work is done by
:class:`~nvmeof_csi.agent.volumes.VolumeOps`, :class:`~nvmeof_csi.agent.snapshots.SnapshotOps`,
:class:`~nvmeof_csi.agent.hosts.HostOps` and :mod:`~nvmeof_csi.agent.converge`, which state their contracts.
Shared by all of them:
- Idempotent and keyed by name (creates; the name's reservation may bring the UUID) or UUID: repeating an
  operation returns the same result.
- Save before acting: state is written before configfs or the pool is touched; :meth:`TargetAgent.converge`
  (run at start) finishes whatever a crash interrupted, so state, configfs and pool end up in agreement.
- Many threads may call in at once; locks are per name and per UUID.
- Errors: ``nvmeof_csi.errors`` classes (NotFound, AlreadyExists, ResourceExhausted, ...).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.converge import Applier, ConvergeReport
from nvmeof_csi.agent.drain import DrainMark
from nvmeof_csi.agent.drbd_status import DrbdState
from nvmeof_csi.agent.fence_spool import FenceRequest
from nvmeof_csi.agent.fencing import FenceOps
from nvmeof_csi.agent.filler import Filler
from nvmeof_csi.agent.health import volume_health
from nvmeof_csi.agent.hosts import HostOps
from nvmeof_csi.agent.names import NameBook, Reservation
from nvmeof_csi.agent.parts import AgentParts, VolumeView
from nvmeof_csi.agent.pool import FileStore
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.readonly import ReadOnlyDevices
from nvmeof_csi.agent.replica_ops import ReplicaOps
from nvmeof_csi.agent.replica_spec import ReplicaSpec
from nvmeof_csi.agent.replicas import Replication
from nvmeof_csi.agent.self_fence import SelfFence
from nvmeof_csi.agent.snapshots import SnapshotOps
from nvmeof_csi.agent.state import SnapshotRecord, StateStore, VolumeRecord
from nvmeof_csi.agent.volumes import VolumeOps
from nvmeof_csi.errors import InvalidArgument, NotFound
from nvmeof_csi.host.keyring import NvmeKeyring, handshake_daemon_running
from nvmeof_csi.nvmeof.parameters import VolumeParameters


class TargetAgent:
    def __init__(
        self,
        name: str,
        nvmet: Nvmet,
        store: FileStore,
        state: StateStore,
        portals: Sequence[PortSpec],
        capacity_limit: int = 0,
        buffered_io: bool = False,
        clock: Callable[[], float] = time.time,
        filler: Filler | None = None,
        sleep: Callable[[float], None] = time.sleep,
        high_water: float = 90.0,
        readonly_devices: ReadOnlyDevices | None = None,
        keyring: NvmeKeyring | None = None,
        handshake_daemon: Callable[[], bool] = handshake_daemon_running,
        replication: Replication | None = None,
        self_fence_after: float = 5.0,
    ) -> None:
        ids = [p.port_id for p in portals]
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"portal IDs must be unique: {ids}")
        self._parts = AgentParts(
            name,
            nvmet,
            store,
            state,
            list(portals),
            capacity_limit,
            buffered_io,
            clock,
            filler,
            high_water,
            readonly_devices=readonly_devices,
            keyring=keyring or NvmeKeyring(),
            handshake_daemon=handshake_daemon,
            replication=replication,
        )
        self._volumes = VolumeOps(self._parts)
        self._snapshots = SnapshotOps(self._parts)
        self._hosts = HostOps(self._parts)
        self._fences = FenceOps(self._parts, sleep)
        self._applier = Applier(self._parts, self._volumes, self._snapshots)
        self._names = NameBook(state.folder)
        self.drain = DrainMark(state.folder)
        self.self_fence = SelfFence(self._parts, self_fence_after)

    # -- what it is made of (read-only) -------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._parts.name

    @property
    def nvmet(self) -> Nvmet:
        return self._parts.nvmet

    @property
    def store(self) -> FileStore:
        return self._parts.store

    @property
    def state(self) -> StateStore:
        return self._parts.state

    @property
    def portals(self) -> list[PortSpec]:
        return list(self._parts.portals)

    @property
    def filler(self) -> Filler | None:
        return self._parts.filler

    # -- views ---------------------------------------------------------------------------------------------
    def volume_health(self, vol_uuid: str) -> list[tuple[str, str, str]]:
        """(status, reason, message) of what is wrong with the volume here (``agent/health.py``)."""
        return volume_health(self._parts, self._parts.volume(vol_uuid))

    def get_volume(self, vol_uuid: str = "", name: str = "") -> VolumeView:
        """By UUID, or by name. A pure read: it never writes or waits."""
        if name:
            named = self._parts.named_volumes(name)
            if not named:
                raise NotFound(f"no volume named {name!r} on agent {self.name}")
            return self._parts.view(named[0])
        return self._parts.view(self._parts.volume(vol_uuid))

    def list_volumes(self) -> list[VolumeView]:
        return [self._parts.view(v) for v in sorted(self._parts.live_volumes(), key=lambda v: v.uuid)]

    def list_volume_page(
        self, after: str, size: int, visible: Callable[[VolumeRecord], bool]
    ) -> tuple[list[VolumeView], str]:
        """One page of :meth:`list_volumes` (the ``visible`` ones after UUID ``after``) and the next page's token
        (``""`` at the end); its cost grows with the page, not with the volumes held."""
        records, more = self._parts.volume_page(after, size, visible)
        return [self._parts.view(r) for r in records], records[-1].uuid if more and records else ""

    @property
    def high_water(self) -> float:
        """Percent of the pool's filesystem past which no volume, snapshot or clone is made."""
        return self._parts.high_water

    def provisioned_bytes(self) -> int:
        return self._parts.provisioned_bytes()

    def capacity_bytes(self) -> int:
        return self._parts.capacity_bytes()

    # -- name reservations (``agent/names.py``) -----------------------------------------------------------
    def reserve_name(self, wanted: Reservation) -> Reservation:
        return self._names.reserve(wanted)

    def lookup_name(self, name: str) -> Reservation | None:
        """The reservation kept here; else, for a live volume of that name here (made before reservations),
        a reservation with an empty ``agent``; else ``None``. A pure read."""
        kept = self._names.lookup(name)
        if kept is not None:
            return kept
        named = self._parts.named_volumes(name)
        return Reservation(name, named[0].uuid, "") if named else None

    def release_name(self, name: str, vol_uuid: str) -> None:
        self._names.release(name, vol_uuid)

    # -- operations ----------------------------------------------------------------------------------------
    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: VolumeParameters,
        labels: Mapping[str, str],
        source_volume: str = "",
        source_snapshot: str = "",
        vol_uuid: str = "",
        replica: ReplicaSpec | None = None,
    ) -> VolumeView:
        return self._volumes.create_volume(
            name, capacity_bytes, parameters, labels, source_volume, source_snapshot, vol_uuid, replica
        )

    def set_replica_role(self, vol_uuid: str, role: str, epoch: int) -> VolumeView:
        return ReplicaOps(self._parts).set_role(vol_uuid, role, epoch)

    @property
    def replication(self) -> Replication | None:
        """The replicated volumes' kernel side (``None``: this agent does not replicate)."""
        return self._parts.replication

    def fence_requests(self) -> list[FenceRequest]:
        """DRBD's fence-peer calls waiting on this node (none when it does not replicate)."""
        return self._parts.replication.fence_requests() if self._parts.replication is not None else []

    def answer_fence(self, vol_uuid: str, pid: int, peer_fenced: bool) -> bool:
        rep = self._parts.replication
        answered = rep is not None and rep.answer_fence(vol_uuid, pid, peer_fenced)
        if answered and peer_fenced:
            self.self_fence.resume(vol_uuid)
        return answered

    def replica_state(self, rec: VolumeRecord) -> DrbdState | None:
        """What the kernel's DRBD says of ``rec``'s replica here (``None``: not up, or not replicated)."""
        if not rec.replica or self._parts.replication is None:
            return None
        return self._parts.replication.state(rec)

    def delete_volume(self, vol_uuid: str) -> None:
        self._volumes.delete_volume(vol_uuid)

    def resize_volume(self, vol_uuid: str, capacity_bytes: int) -> VolumeView:
        return self._volumes.resize_volume(vol_uuid, capacity_bytes)

    def modify_volume(self, vol_uuid: str, changes: Mapping[str, str]) -> VolumeView:
        return self._volumes.modify_volume(vol_uuid, changes)

    def allow_host(
        self,
        vol_uuid: str,
        host_nqn: str,
        secret: str = "",
        readonly: bool = False,
        ctrl_secret: str = "",
        node_name: str = "",
    ) -> VolumeView:
        return self._hosts.allow_host(vol_uuid, host_nqn, secret, readonly, ctrl_secret, node_name)

    def host_keys(self, vol_uuid: str, host_nqn: str) -> tuple[str, str, str]:
        return self._hosts.host_keys(vol_uuid, host_nqn)

    def rotate_host_key(self, host_nqn: str, controller_key: bool = False) -> list[str]:
        return self._hosts.rotate_host_key(host_nqn, controller_key)

    def deny_host(self, vol_uuid: str, host_nqn: str) -> VolumeView:
        return self._hosts.deny_host(vol_uuid, host_nqn)

    def fence_host(self, vol_uuid: str, host_nqn: str, reason: str, boot_id: str = "") -> VolumeView:
        return self._fences.fence_host(vol_uuid, host_nqn, reason, boot_id)

    def unfence_host(self, vol_uuid: str, host_nqn: str) -> VolumeView:
        return self._fences.unfence_host(vol_uuid, host_nqn)

    def resume_fences(self) -> list[str]:
        """Finish fences a killed agent left undone; run at start, after :meth:`converge` (see ``fencing``)."""
        return self._fences.resume()

    def finish_rotations(self) -> list[str]:
        """Finish key rotations a killed agent left half done; run at start, after :meth:`converge` (``hosts``)."""
        return self._hosts.finish_rotations()

    def create_snapshot(self, name: str, source_volume: str) -> SnapshotRecord:
        return self._snapshots.create_snapshot(name, source_volume)

    def delete_snapshot(self, snap_uuid: str) -> None:
        self._snapshots.delete_snapshot(snap_uuid)

    def list_snapshots(self, source_volume: str = "", snapshot_uuid: str = "") -> list[SnapshotRecord]:
        return self._snapshots.list_snapshots(source_volume, snapshot_uuid)

    def list_portals(self) -> list[tuple[PortSpec, str]]:
        return self._hosts.list_portals()

    def set_ana(self, group: str, ana_state: str) -> list[tuple[PortSpec, str]]:
        return self._hosts.set_ana(group, ana_state)

    def converge(self, prune: bool = False) -> ConvergeReport:
        """Make configfs and the pool match the saved state (see ``converge``)."""
        return self._applier.converge(prune)

    def resume_fills(self) -> None:
        """Finish fills a restart interrupted; run once the agent serves (see ``VolumeOps.resume_fills``)."""
        self._volumes.resume_fills()
