"""Replicated volumes in the agent's operations: what a create of one checks, how large its file is, the namespace's
device and role on each start, and the controller's role changes (:class:`ReplicaOps`).

Contract:
- A replicated volume is made only on an agent configured for replication (``--replication-address``), without a
  content source or a dataset, on a DRBD minor and port no other volume here holds (``FailedPrecondition``
  naming what is missing or taken); ``replicas: 2`` without the pair is ``InvalidArgument``; a repeated create
  must name the same pair (``AlreadyExists`` otherwise).
- :meth:`ReplicaOps.set_role` moves a ready replica to the controller's role in an epoch no older than its own:
  ``primary`` (promote, then enable the namespace, then link the portals); ``fenced`` (saved first, then unlink
  every portal, disable the namespace, demote; cut off from its peer, its disk Outdated); ``secondary`` (as
  ``fenced``, then link the portals again: the host's path here has no namespace behind it); ``handover`` (as
  ``fenced`` without outdating: a planned switchover, only from ``primary`` while DRBD shows the peer
  ``Connected`` and ``UpToDate``, else ``FailedPrecondition``); ``discard`` (as ``secondary``, and a replica
  ``StandAlone`` after a split brain connects again with DRBD's ``--discard-my-data``: the controller's
  resolution, never DRBD's own). A ``primary`` goes to ``secondary`` (or ``discard``) only through
  ``fenced`` or ``handover`` (``FailedPrecondition``): the controller promotes the peer in between, so the host
  never loses the namespace on its last path. Repeating a call changes nothing. The
  caller holds nothing; this takes the volume's key.
- A replicated volume is copied (a snapshot of it, a volume cloned from it) on the agent its volume ID names, only
  while DRBD says this replica holds every acknowledged write (:func:`check_copy_source`, ``FailedPrecondition``
  naming the states otherwise): its disk ``UpToDate`` and it is ``Primary``, or ``Secondary`` and connected to its
  peer (protocol C: the primary acknowledges a write only once this side has written it; a link lost unnoticed
  holds the primary's acknowledgements until the fence-peer call is answered). A Secondary cut off may be
  Outdated or mid-resync. The copy is a point in time of the whole file (a reflink, or the pool's copy), DRBD's
  metadata at its end included: DRBD's device is a little larger than the capacity (its metadata takes less
  than the room reserved for it), and a filesystem made on it may reach past the capacity.
"""

from __future__ import annotations

from pathlib import Path

from nvmeof_csi.agent.parts import NSID, AgentParts, VolumeView
from nvmeof_csi.agent.replica_spec import DISCARD, FENCED, HANDOVER, PRIMARY, SECONDARY, ReplicaSpec
from nvmeof_csi.agent.replicas import Replication, Stack, metadata_bytes, next_role
from nvmeof_csi.agent.state_model import READY, VolumeRecord
from nvmeof_csi.errors import AlreadyExists, FailedPrecondition, InvalidArgument, Unavailable
from nvmeof_csi.nvmeof.nqn import namespace_nguid, volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters

IN_STEP = frozenset({"Connected", "SyncSource", "PausedSyncS"})  # a peer that gets every write from here
NOT_REPLICATING = "is not configured for replicated volumes (--replication-address)"


def replication(parts: AgentParts) -> Replication:
    if parts.replication is None:
        raise FailedPrecondition(f"agent {parts.name} {NOT_REPLICATING}")
    return parts.replication


def check_replicable(parts: AgentParts, params: VolumeParameters, source: str, replica: ReplicaSpec | None) -> None:
    """A create that names a pair (or ``replicas: 2``) on this agent: see the module's contract."""
    if replica is None:
        raise InvalidArgument("parameter 'replicas: 2': the controller makes the pair (the create names no replica)")
    replication(parts)
    for other in parts.state.current.volumes.values():
        mine = ReplicaSpec.parse(other.replica) if other.replica else None
        if mine is not None and (mine.minor == replica.minor or mine.port == replica.port):
            raise FailedPrecondition(
                f"agent {parts.name}: DRBD minor {replica.minor} or port {replica.port} is held by volume {other.uuid}"
            )
    if source:
        raise FailedPrecondition("a replicated volume cannot be made from a snapshot or a volume yet")
    if params.dataset is not None:
        raise FailedPrecondition("a replicated volume cannot hold a dataset yet")


def check_copy_source(parts: AgentParts, rec: VolumeRecord) -> None:
    """Whether ``rec``'s file may be copied here (see the module's contract); nothing to check for a volume
    that is not replicated."""
    if not rec.replica:
        return
    now = replication(parts).state(rec)
    if now is None:
        raise FailedPrecondition(f"volume {rec.uuid} is replicated and its replica on agent {parts.name} is down")
    holds_all = now.disk == "UpToDate" and (now.role == "Primary" or now.connection in IN_STEP)
    if not holds_all:
        raise FailedPrecondition(
            f"volume {rec.uuid} is replicated: it is copied (snapshot or clone) while its replica on agent "
            f"{parts.name} holds every acknowledged write (UpToDate, and Primary or connected to its peer); it "
            f"is {now.role}/{now.disk} ({now.connection}): retry once it is back in sync"
        )


def check_same_pair(found: VolumeRecord, replica: ReplicaSpec | None) -> None:
    same = (not found.replica and replica is None) or (
        bool(found.replica) and replica is not None and ReplicaSpec.parse(found.replica).same_pair(replica)
    )
    if not same:
        raise AlreadyExists(f"volume {found.name!r} exists with another replica pair")


def backing_bytes(rec: VolumeRecord) -> int:
    """The size of the volume's file: its capacity, and DRBD's metadata for a replica."""
    return rec.capacity_bytes + (metadata_bytes(rec.capacity_bytes) if rec.replica else 0)


def replica_stack(parts: AgentParts, rec: VolumeRecord, backing: Path) -> Stack:
    """The namespace's device, enabled state and links: the file itself for a single copy; the replica's device
    stack brought up for a replica."""
    if not rec.replica:
        return Stack(str(backing), True, True)
    return replication(parts).prepare(rec, backing)


def unlink_everywhere(parts: AgentParts, nqn: str) -> None:
    for portal in parts.portals:
        parts.nvmet.unlink(portal.port_id, nqn)


class ReplicaOps:
    def __init__(self, parts: AgentParts) -> None:
        self._p = parts

    def set_role(self, vol_uuid: str, role: str, epoch: int) -> VolumeView:
        p = self._p
        with p.keys.hold(vol_uuid):
            rec = p.volume(vol_uuid)
            if not rec.replica:
                raise FailedPrecondition(f"volume {vol_uuid} is not replicated")
            if rec.status != READY:
                raise Unavailable(f"volume {vol_uuid} is still being created on agent {p.name}; retry")
            rep = replication(p)
            new = next_role(rec, role, epoch)
            nqn, path = volume_nqn(rec.uuid), p.store.volume_path(rec.uuid)
            if role == PRIMARY:
                rep.promote(new)  # refused: nothing saved, nothing changed
                new = p.state.put_volume(new)
                self._present(new, nqn, path)
                return p.view(new)
            now = rep.state(rec)
            held = rec.replica.get("role")
            lowered = role in (SECONDARY, DISCARD)
            if lowered and now is not None and now.role == "Primary" and held not in (FENCED, HANDOVER):
                raise FailedPrecondition(
                    f"volume {vol_uuid}: a primary replica becomes secondary through fenced or handover "
                    "(its peer promoted between)"
                )
            if role == HANDOVER and held != HANDOVER and (held != PRIMARY or now is None or not now.in_sync):
                seen = f"{now.connection} {now.disk}/{now.peer_disk}" if now is not None else "down"
                raise FailedPrecondition(
                    f"volume {vol_uuid}: only a primary in sync with its peer hands over (it is {held}, DRBD {seen})"
                )
            new = p.state.put_volume(new)  # save before acting: a restart finishes the step down
            unlink_everywhere(p, nqn)
            p.nvmet.disable_namespace(nqn, NSID)
            rep.demote(new, outdate=role == FENCED)
            if role == DISCARD:
                rep.discard(new)
            if lowered:
                p.export(new, nqn, p.writers(new))
            return p.view(new)

    def _present(self, rec: VolumeRecord, nqn: str, path: Path) -> None:
        p = self._p
        stack = replication(p).prepare(rec, path)
        p.nvmet.ensure_namespace(
            nqn, NSID, stack.device, rec.uuid, namespace_nguid(rec.uuid), p.buffered_io, enable=stack.enable
        )
        p.export(rec, nqn, p.writers(rec))


__all__ = [
    "ReplicaOps",
    "backing_bytes",
    "check_replicable",
    "check_same_pair",
    "replica_stack",
    "replication",
    "unlink_everywhere",
]
