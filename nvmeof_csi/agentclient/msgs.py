"""The agent's messages as the service layer's types (no I/O): a volume with the volume context a node needs
(NQN, namespace UUID, transport, the portals of that transport, the StorageClass tunables, auth mode and I/O
limits, TLS mode), its accessible topology and content source; a snapshot."""

from __future__ import annotations

from dataclasses import replace

from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.context import Portal, VolumeContext
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import ContentSource, Fence, Snapshot, Volume, VolumeRef
from nvmeof_csi.topology.fabric_map import AgentEntry
from nvmeof_csi.topology.placement import volume_segment


def volume_of(entry: AgentEntry, vol: pb.Volume) -> Volume:
    """The service's volume; its parameters, as the agent stored them, are parsed here (the edge) once."""
    params = VolumeParameters.parse(vol.parameters)
    transport = params.transport
    context = VolumeContext(
        nqn=vol.nqn,
        namespace_uuid=vol.namespace_uuid,
        transport=transport,
        portals=tuple(Portal(p.trtype, p.traddr, str(p.trsvcid)) for p in vol.portals if p.trtype == transport),
        tunables=params.tunables,
        agent=entry.name,
        auth=params.auth,
        tls=params.tls,
        qos=params.limits,
    ).to_dict()
    source = None
    if vol.source_snapshot_uuid:
        source = ContentSource("snapshot", VolumeRef(entry.name, vol.source_snapshot_uuid))
    elif vol.source_volume_uuid:
        source = ContentSource("volume", VolumeRef(entry.name, vol.source_volume_uuid))
    return Volume(
        ref=VolumeRef(entry.name, vol.uuid),
        name=vol.name,
        capacity_bytes=vol.capacity_bytes,
        parameters=params,
        context=context,
        accessible_topology=(volume_segment(entry, transport),),
        published_nodes=tuple(sorted(vol.allowed_hosts)),
        source=source,
        ready=vol.status != "creating",
        fenced={f.host_nqn: Fence(f.reason, f.fenced_at, f.boot_id) for f in vol.fenced_hosts},
    )


def pair_volume_of(first: AgentEntry, vol: pb.Volume, peer: pb.Volume) -> Volume:
    """A replicated volume as the service sees it, from both replicas' messages: the first's (the agent the ID
    names) with every portal of both agents in its context (the node connects to both: one multipath head), the
    hosts either allows, and ready once one replica is the primary (a pair not yet promoted is still being
    made)."""
    one = volume_of(first, vol)
    transport = one.parameters.transport
    portals = [
        Portal(p.trtype, p.traddr, str(p.trsvcid)) for v in (vol, peer) for p in v.portals if p.trtype == transport
    ]
    context = {**one.context, "portals": ",".join(p.key for p in portals)}
    hosts = tuple(sorted(set(vol.allowed_hosts) | set(peer.allowed_hosts)))
    primary = "primary" in (vol.replica.role, peer.replica.role)
    return replace(one, context=context, published_nodes=hosts, ready=one.ready and primary)


def snapshot_of(entry: AgentEntry, snap: pb.Snapshot) -> Snapshot:
    return Snapshot(
        ref=VolumeRef(entry.name, snap.uuid),
        name=snap.name,
        source=VolumeRef(entry.name, snap.source_volume_uuid),
        size_bytes=snap.size_bytes,
        created_at=float(snap.created_at_unix),
        ready=snap.ready,
    )
