"""The agent's records as ``nvmeof_agent.proto`` messages (no I/O): volumes (with their health for GetVolume),
portals, snapshots, name reservations; and what a node may see of a volume (its own host only)."""

from __future__ import annotations

from collections.abc import Mapping

from nvmeof_csi.agent.authz import NODE, caller
from nvmeof_csi.agent.drbd_status import DrbdState
from nvmeof_csi.agent.names import Reservation
from nvmeof_csi.agent.parts import VolumeView
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.state import SnapshotRecord
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb


def portal_msg(portal: PortSpec, ana_state: str) -> pb.Portal:
    return pb.Portal(
        port_id=portal.port_id,
        trtype=portal.trtype,
        traddr=portal.traddr,
        trsvcid=portal.trsvcid,
        group=portal.group,
        ana_state=ana_state,
    )


def _labels(view: VolumeView) -> dict[str, str]:
    labels = dict(view.record.labels)
    if view.progress:
        labels["dataset.progress"] = view.progress
    return labels


def replica_msg(replica: Mapping[str, str], now: DrbdState | None) -> pb.Replica:
    """A replica's role and peer (never its secret), with the kernel's DRBD state when known."""
    msg = pb.Replica(
        peer_agent=replica.get("peer_agent", ""),
        role=replica.get("role", ""),
        epoch=int(replica.get("epoch", "0")),
        minor=int(replica.get("minor", "0")),
        port=int(replica.get("port", "0")),
    )
    if now is not None:
        msg.drbd_role, msg.disk, msg.peer_disk, msg.connection = now.role, now.disk, now.peer_disk, now.connection
        msg.synced_percent = now.synced_percent or 0.0
        msg.out_of_sync_bytes = (now.out_of_sync_kib or 0) * 1024
    return msg


def volume_msg(view: VolumeView, replica_now: DrbdState | None = None) -> pb.Volume:
    """``replica_now``: the kernel's DRBD state of a replicated volume's replica here (GetVolume and role
    changes read it; listings do not)."""
    rec = view.record
    return pb.Volume(
        uuid=rec.uuid,
        name=rec.name,
        capacity_bytes=rec.capacity_bytes,
        parameters=dict(rec.parameters),
        labels=_labels(view),
        nqn=view.nqn,
        namespace_uuid=view.namespace_uuid,
        namespace_nguid=view.namespace_nguid,
        allowed_hosts=sorted(rec.hosts),
        source_volume_uuid=rec.source_volume,
        source_snapshot_uuid=rec.source_snapshot,
        portals=[portal_msg(p, s) for p, s in view.portals],
        status=rec.status,
        readonly_hosts=list(rec.readonly_hosts),
        created_at=rec.created_at,
        fenced_hosts=[
            pb.FencedHost(host_nqn=h, reason=m["reason"], fenced_at=m["at"], boot_id=m["boot_id"], done=m["done"])
            for h, m in sorted(rec.fenced.items())
        ],
        replica=replica_msg(rec.replica, replica_now) if rec.replica else None,
    )


def own_hosts_only(msg: pb.Volume) -> pb.Volume:
    """For a node: ``msg`` naming no host but the caller's own (other hosts' NQNs, read-only marks and fences,
    with their boot IDs, are not a node's business); every other role: ``msg`` as it is."""
    who = caller()
    if who.role != NODE:
        return msg
    mine = [h for h in msg.allowed_hosts if h == who.host_nqn]
    readonly = [h for h in msg.readonly_hosts if h == who.host_nqn]
    fenced = [f for f in msg.fenced_hosts if f.host_nqn == who.host_nqn]
    del msg.allowed_hosts[:], msg.readonly_hosts[:], msg.fenced_hosts[:]
    msg.allowed_hosts.extend(mine)
    msg.readonly_hosts.extend(readonly)
    msg.fenced_hosts.extend(fenced)
    return msg


def volume_with_health(agent: TargetAgent, view: VolumeView) -> pb.Volume:
    """What GetVolume answers: the volume and what is wrong with it here (``agent/health.py``)."""
    msg = volume_msg(view, agent.replica_state(view.record))
    issues = agent.volume_health(view.record.uuid)
    msg.health.extend(pb.HealthIssue(status=s, reason=r, message=m) for s, r, m in issues)
    msg.backing_file = str(agent.store.volume_path(view.record.uuid))
    return msg


def reservation_msg(res: Reservation) -> pb.Reservation:
    return pb.Reservation(name=res.name, volume_uuid=res.volume_uuid, agent=res.agent)


def snapshot_msg(snap: SnapshotRecord) -> pb.Snapshot:
    return pb.Snapshot(
        uuid=snap.uuid,
        name=snap.name,
        source_volume_uuid=snap.source_volume,
        size_bytes=snap.size_bytes,
        created_at_unix=int(snap.created_at),
        ready=snap.status == "ready",
    )
