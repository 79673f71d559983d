"""The kernel side of this agent's replicas (``replicas: "2"`` volumes): the volume's file under a loop device,
the DRBD 8.4 resource on it (``agent/drbd.py``), and which of four roles the controller gave the replica.

Roles (``replica_spec``), each a state of DRBD, the namespace and the ports together:

- ``primary``: DRBD Primary, the namespace on ``/dev/drbdN`` enabled, the subsystem linked to its portals.
- ``secondary``: DRBD Secondary, the namespace made but never enabled (DRBD refuses opens on a Secondary), the
  subsystem linked: the host holds a path here with no namespace behind it, ready for a failover.
- ``fenced``: the subsystem unlinked from every portal first (the host's paths here go to CONNECTING with
  their I/O queued, never failed), then the namespace disabled, then DRBD Secondary. The step between an old
  primary and its peer's promotion: a namespace is never disabled while a host still sees it LIVE here, because
  the host deletes the multipath head when the last path's namespace goes.
- ``handover``: as ``fenced``, but the disk stays ``UpToDate`` (never outdated): a planned switchover's step
  between a primary in sync with its peer and that peer's promotion; then ``secondary`` links it again.

Contract:
- :meth:`Replication.prepare` makes the device stack for a record (idempotent; DRBD metadata only on a fresh file,
  i.e. a record not yet ``ready`` whose minor is not configured) and returns ``(device, enable, linked)`` for
  the namespace: enabled only when the kernel says this replica is Primary (a record saying ``primary`` with a
  kernel saying Secondary, e.g. after a reboot, is not enabled: only the controller promotes).
- :meth:`Replication.promote` promotes, never forcing: a brand-new pair (Connected, both Inconsistent) skips
  its initial sync first (both files are all zeroes); DRBD's refusal of a replica that is not UpToDate is
  ``FailedPrecondition``. :meth:`Replication.fence` and :meth:`Replication.demote` only ever lower the role.
- Roles change only with an epoch at least the record's: an older epoch is ``Aborted`` (a retry of a decision
  the controller has since replaced changes nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.agent.drbd import DrbdResources
from nvmeof_csi.agent.drbd_config import resource_name, resource_text
from nvmeof_csi.agent.drbd_status import DrbdState
from nvmeof_csi.agent.fence_spool import PEER_FENCED, STAY_FROZEN, FenceRequest, FenceSpool
from nvmeof_csi.agent.replica_devices import LoopLinks
from nvmeof_csi.agent.replica_spec import ACTIONS, DISCARD, FENCED, HANDOVER, SECONDARY, ReplicaSpec
from nvmeof_csi.agent.state_model import READY, VolumeRecord
from nvmeof_csi.errors import Aborted, FailedPrecondition

log = logging.getLogger(__name__)
DISCONNECTED = frozenset(
    {"StandAlone", "Disconnecting", "Unconnected", "Timeout", "BrokenPipe", "NetworkFailure", "ProtocolError",
     "TearDown", "WFConnection", "WFReportParams"}
)  # fmt: skip  # DRBD 8.4 connection states without a live peer
AFTER_RESYNC = "/bin/true"  # the kernel's helper is the fence spool's script; drbdadm's handlers are not run


def metadata_bytes(capacity: int) -> int:
    """Room DRBD's internal metadata needs at the end of a ``capacity``-byte volume's file: a bitmap of one bit
    per 4 KiB (rounded up to 4 KiB), its activity log and superblock, with a MiB to spare."""
    bitmap = -(-capacity // (4096 * 8))
    return -(-bitmap // 4096) * 4096 + (1 << 20)


@dataclass(frozen=True)
class Stack:
    """What the namespace of a replica should be: its device, whether it is enabled, whether it is linked."""

    device: str
    enable: bool
    linked: bool


class Replication:
    def __init__(
        self,
        drbd: DrbdResources,
        loops: LoopLinks,
        host: str,
        fence_helper: str,
        spool: FenceSpool | None = None,
        address: str = "",
    ) -> None:
        """``host``: this node's ``uname -n`` (DRBD finds its own section by it); ``fence_helper``: the path
        written as the resource's ``fence-peer`` handler (the kernel runs the module's usermode helper);
        ``spool``: where that helper's calls wait for the controller (``agent/fence_spool.py``); ``address``:
        this node's replication address (``--replication-address``), told to the controller by Health."""
        self._drbd, self._loops, self._host, self._helper = drbd, loops, host, fence_helper
        self._spool = spool
        self.host, self.address = host, address

    def fence_requests(self) -> list[FenceRequest]:
        """DRBD's fence-peer calls waiting here, oldest first."""
        return self._spool.pending() if self._spool is not None else []

    def answer_fence(self, vol_uuid: str, pid: int, peer_fenced: bool) -> bool:
        """The controller's answer to one waiting call; False when no such call waits."""
        if self._spool is None:
            return False
        code = PEER_FENCED if peer_fenced else STAY_FROZEN
        return self._spool.answer(resource_name(vol_uuid), pid, code)

    @staticmethod
    def spec(rec: VolumeRecord) -> ReplicaSpec:
        return ReplicaSpec.parse(rec.replica)

    def state(self, rec: VolumeRecord) -> DrbdState | None:
        return self._drbd.state(self.spec(rec).minor)

    def prepare(self, rec: VolumeRecord, backing: Path) -> Stack:
        spec = self.spec(rec)
        self._loops.attach(rec.uuid, backing)
        text = resource_text(
            rec.uuid, spec.minor, spec.sides(rec.uuid, self._host), spec.secret, self._helper, AFTER_RESYNC
        )
        self._drbd.write(rec.uuid, text)
        if rec.status != READY and self._drbd.state(spec.minor) is None:
            self._drbd.create_metadata(rec.uuid, spec.secret)  # a fresh file: nothing to lose
        self._drbd.up(rec.uuid, spec.secret, spec.minor)
        now = self._drbd.state(spec.minor)
        primary = now is not None and now.role == "Primary"
        return Stack(f"/dev/drbd{spec.minor}", primary, spec.role not in (FENCED, HANDOVER))

    def promote(self, rec: VolumeRecord) -> None:
        """Primary (see the contract); the caller then enables the namespace and links the ports."""
        spec = self.spec(rec)
        now = self._drbd.state(spec.minor)
        if now is None:
            raise FailedPrecondition(f"replica of volume {rec.uuid} is not up on this node (DRBD minor {spec.minor})")
        if now.role == "Primary":
            return
        if now.connection == "Connected" and now.disk == now.peer_disk == "Inconsistent":
            log.info("volume %s: a brand-new pair: initial sync skipped", rec.uuid)
            self._drbd.skip_initial_sync(rec.uuid, spec.secret)
        self._drbd.promote(rec.uuid, spec.secret)

    def demote(self, rec: VolumeRecord, outdate: bool = False) -> None:
        """Secondary; the caller has taken the namespace away first. ``outdate`` (a fenced replica): an UpToDate
        disk is marked Outdated, so DRBD itself refuses to promote it until a resync from the peer has made it
        UpToDate again. That holds even while this side still shows its peer connected: the peer asks to fence
        only once it lost this side, and this side may not have noticed yet (it is cut, outdated, and set to
        reconnect)."""
        spec = self.spec(rec)
        now = self._drbd.state(spec.minor)
        if now is not None and now.role == "Primary":
            self._drbd.demote(rec.uuid, spec.secret)
            now = self._drbd.state(spec.minor)
        if outdate and now is not None and now.disk == "UpToDate":
            log.warning("volume %s: replica fenced (%s): its disk is now Outdated", rec.uuid, now.connection)
            self._drbd.outdate(rec.uuid, spec.secret, cut=now.connection not in DISCONNECTED)

    def discard(self, rec: VolumeRecord) -> None:
        """The controller's split-brain resolution on the loser (a Secondary by now): a replica cut off from its
        peer (``StandAlone``: DRBD found both sides changed and refused to connect) connects again discarding
        its own changes, to resync from the peer. A replica already connecting or connected is left as it is
        (a repeated call); one that is not up is ``FailedPrecondition``."""
        spec = self.spec(rec)
        now = self._drbd.state(spec.minor)
        if now is None:
            raise FailedPrecondition(f"replica of volume {rec.uuid} is not up on this node (DRBD minor {spec.minor})")
        if now.connection != "StandAlone":
            return
        log.warning("volume %s: split brain resolved by the controller: this replica's changes are discarded", rec.uuid)
        self._drbd.discard_mine(rec.uuid, spec.secret)

    def resize(self, rec: VolumeRecord, backing: Path) -> None:
        """After the file grew: the loop grows; the Primary grows the DRBD device (both files grown, Connected:
        the controller grows the secondary's first)."""
        self._loops.refresh(backing)
        spec = self.spec(rec)
        now = self._drbd.state(spec.minor)
        if now is not None and now.role == "Primary":
            if now.connection != "Connected":
                raise FailedPrecondition(
                    f"volume {rec.uuid} can grow only while both replicas are connected (now {now.connection})"
                )
            self._drbd.resize(rec.uuid, spec.secret, spec.minor, rec.capacity_bytes)

    def remove(self, rec: VolumeRecord, backing: Path) -> None:
        """DRBD down, the link and loop gone (the caller removed the namespace first and deletes the file)."""
        spec = self.spec(rec)
        self._drbd.down(rec.uuid, spec.secret, spec.minor)
        self._loops.detach(rec.uuid, backing)


def next_role(rec: VolumeRecord, role: str, epoch: int) -> VolumeRecord:
    """``rec`` with the controller's new ``role`` in ``epoch`` (``discard`` is saved as ``secondary``); an older
    epoch is ``Aborted``, an unknown role ``FailedPrecondition``."""
    spec = ReplicaSpec.parse(rec.replica)
    if role not in ACTIONS:
        raise FailedPrecondition(f"replica role {role[:20]!r} must be one of {', '.join(ACTIONS)}")
    role = SECONDARY if role == DISCARD else role
    if epoch < spec.epoch:
        raise Aborted(f"volume {rec.uuid}: epoch {epoch} is older than this replica's {spec.epoch}")
    return rec.evolve(replica={**rec.replica, "role": role, "epoch": str(epoch)})


__all__ = ["Replication", "Stack", "metadata_bytes", "next_role"]
