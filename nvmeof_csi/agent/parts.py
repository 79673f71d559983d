"""What every part of the target agent shares: its configfs tree, pool, saved state, portals, locks and the
optional filler, plus the views the API shows.

Contract: :class:`AgentParts` holds no logic that changes anything; the operation modules (``volumes``,
``snapshots``, ``hosts``, ``converge``) do. Lock keys: a volume's or snapshot's UUID, ``name:<volume name>``
and ``snap-name:<snapshot name>`` in :attr:`AgentParts.keys` (blocking, sorted, so holders never deadlock);
portal (port) changes under :attr:`AgentParts.ports_lock`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.filler import Filler
from nvmeof_csi.agent.pool import FileStore
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.readonly import ReadOnlyDevices
from nvmeof_csi.agent.replicas import Replication
from nvmeof_csi.agent.state import DELETING, StateStore, VolumeRecord
from nvmeof_csi.errors import NotFound
from nvmeof_csi.host.keyring import NvmeKeyring, handshake_daemon_running
from nvmeof_csi.nvmeof.nqn import check_host_nqn, namespace_nguid, readonly_nqn, volume_nqn
from nvmeof_csi.nvmeof.tlspsk import identity, parse_psk
from nvmeof_csi.rpc.locks import KeyedMutex

NSID = 1
MODEL = "nvmeof-csi"


@dataclass(frozen=True)
class VolumeView:
    """A volume as the API shows it."""

    record: VolumeRecord
    nqn: str
    namespace_uuid: str
    namespace_nguid: str
    portals: Sequence[tuple[PortSpec, str]]  # (portal, ANA state)
    progress: str = ""  # filling in progress ("copying: 12/100 files, ...")


@dataclass
class AgentParts:
    name: str
    nvmet: Nvmet
    store: FileStore
    state: StateStore
    portals: list[PortSpec]
    capacity_limit: int = 0
    buffered_io: bool = False
    clock: Callable[[], float] = time.time
    filler: Filler | None = None
    high_water: float = 90.0  # percent of the pool's filesystem past which nothing new is made
    readonly_devices: ReadOnlyDevices | None = None  # None: read-only grants are refused (``agent/readonly.py``)
    keys: KeyedMutex = field(default_factory=KeyedMutex)
    name_wait: float = 60.0  # seconds a create waits for another create of its name before ABORTED
    ports_lock: threading.Lock = field(default_factory=threading.Lock)
    room_lock: threading.Lock = field(default_factory=threading.Lock)  # the pool's room check and the saves it admits
    keyring: NvmeKeyring = field(default_factory=NvmeKeyring)  # TLS PSKs for ``tls: psk`` volumes
    handshake_daemon: Callable[[], bool] = handshake_daemon_running  # is tlshd running on this machine
    replication: Replication | None = None  # None: replicated volumes are refused (``agent/replicas.py``)

    def view(self, rec: VolumeRecord) -> VolumeView:
        ana = self.state.current.ana
        return VolumeView(
            rec,
            volume_nqn(rec.uuid),
            rec.uuid,
            namespace_nguid(rec.uuid),
            [(p, ana.get(p.group, "optimized")) for p in portals_for(rec, self.portals)],
            self.filler.progress(rec.uuid) if self.filler else "",
        )

    def export(self, rec: VolumeRecord, nqn: str, hosts: Iterable[str]) -> None:
        """Put each of ``hosts``' TLS PSK for subsystem ``nqn`` in this kernel's keyring (``tls: psk`` volumes),
        then link ``nqn`` to ``rec``'s portals and off every portal of the other kind (``portals_for``)."""
        self.put_psks(rec, nqn, hosts)
        mine = portals_for(rec, self.portals)
        for portal in self.portals:
            if portal in mine:
                self.nvmet.link(portal.port_id, nqn)
            else:
                self.nvmet.unlink(portal.port_id, nqn)

    def put_psks(self, rec: VolumeRecord, nqn: str, hosts: Iterable[str]) -> None:
        for host_nqn in hosts:
            if rec.tls_keys.get(host_nqn):
                self.keyring.put_psk(identity(host_nqn, nqn), parse_psk(rec.tls_keys[host_nqn]))

    def cycle_links(self, nqns: Sequence[str], between: Callable[[], None] = lambda: None) -> list[int]:
        """End every live controller of the subsystems ``nqns``: each is unlinked from its ports and linked again
        (nvmet tears a port's controllers of a subsystem down when it leaves the port; a host no longer allowed
        cannot come back). ``between`` runs before each port but the first. Returns the ports cycled."""
        ended = []
        with self.ports_lock:
            links = [
                (portal.port_id, nqn)
                for nqn in nqns
                if self.nvmet.has_subsystem(nqn)
                for portal in self.portals
                if nqn in self.nvmet.linked(portal.port_id)
            ]
            for index, (port, nqn) in enumerate(links):
                if index:
                    between()
                self.nvmet.unlink(port, nqn)
                self.nvmet.link(port, nqn)
                ended.append(port)
        return ended

    def drop_psks(self, rec: VolumeRecord, hosts: Iterable[str]) -> None:
        """Take ``hosts``' TLS PSKs for ``rec``'s subsystems out of this kernel's keyring (a grant that ends leaves
        no key behind to read or to exhaust root's key quota with)."""
        if not wants_tls(rec):
            return
        for host_nqn in hosts:
            for nqn in (volume_nqn(rec.uuid), readonly_nqn(rec.uuid)):
                self.keyring.drop_psk(identity(host_nqn, nqn))

    def writers(self, rec: VolumeRecord) -> list[str]:
        """The hosts allowed on the volume's own (writable) subsystem: every grant that is not read-only."""
        return [h for h in rec.hosts if h not in rec.readonly_hosts]

    def live_volumes(self) -> list[VolumeRecord]:
        return [v for v in self.state.current.volumes.values() if v.status != DELETING]

    def volume_page(
        self, after: str, size: int, visible: Callable[[VolumeRecord], bool]
    ) -> tuple[list[VolumeRecord], bool]:
        """Up to ``size`` live, ``visible`` volumes whose UUID sorts after ``after``, in UUID order, and whether more
        follow. Costs the page (plus the records ``visible`` refuses), not the whole state."""
        state = self.state.current
        order = state.volume_order
        found: list[VolumeRecord] = []
        at = bisect_right(order, after) if after else 0
        while at < len(order) and len(found) <= size:
            rec = state.volumes[order[at]]
            if rec.status != DELETING and visible(rec):
                found.append(rec)
            at += 1
        return found[:size], len(found) > size

    def named_volumes(self, name: str) -> list[VolumeRecord]:
        """The live volumes called ``name`` here (a pure read of the current state)."""
        return [v for v in self.state.named_volumes(name) if v.status != DELETING]

    def volume(self, vol_uuid: str) -> VolumeRecord:
        rec = self.state.current.volumes.get(vol_uuid)
        if rec is None or rec.status == DELETING:
            raise NotFound(f"volume {vol_uuid} does not exist on agent {self.name}")
        return rec

    @contextmanager
    def holding(self, vol_uuid: str, host_nqn: str) -> Iterator[VolumeRecord]:
        """A host NQN checked, the volume's and the host's keys held, and the volume's live record."""
        check_host_nqn(host_nqn)
        with self.keys.hold(vol_uuid), self.keys.hold(f"host:{host_nqn}"):
            yield self.volume(vol_uuid)

    def provisioned_bytes(self) -> int:
        """Every volume's size and every snapshot's: a snapshot shares its source's blocks until the source is
        rewritten, and then may come to hold all of them."""
        return self.state.provisioned_bytes()

    @contextmanager
    def reserving(self, wanted: int) -> Iterator[None]:
        """Room for ``wanted`` more bytes (a new volume, clone or snapshot, or a volume's growth), checked and
        held until the caller saved the record that counts them: two creates of different names never both pass
        a check only one of them fits. ``ResourceExhausted`` when there is no room, or the pool's filesystem is
        past its high-water mark. Take it inside the record's key, never the other way round."""
        with self.room_lock:
            self.store.check_space(wanted, self.provisioned_bytes(), self.capacity_bytes(), self.high_water)
            yield

    def capacity_bytes(self) -> int:
        return self.capacity_limit or self.store.usage().total_bytes


def wants_tls(rec: VolumeRecord) -> bool:
    return rec.options.tls == "psk"


def portals_for(rec: VolumeRecord, portals: Sequence[PortSpec]) -> list[PortSpec]:
    """The portals that export ``rec``: the TLS portals for a ``tls: psk`` volume, else the clear-text ones."""
    return [p for p in portals if p.tls == wants_tls(rec)]
