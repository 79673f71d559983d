"""CSI Controller service: validate, call :class:`VolumeService`, build the reply.

Capabilities offered: CREATE_DELETE_VOLUME, PUBLISH_UNPUBLISH_VOLUME, LIST_VOLUMES,
LIST_VOLUMES_PUBLISHED_NODES, GET_CAPACITY, EXPAND_VOLUME, GET_VOLUME, GET_VOLUME_HEALTH, LIST_VOLUME_HEALTH
(CSI 1.13 alpha: the agent's view of each volume), SINGLE_NODE_MULTI_WRITER, PUBLISH_READONLY, MODIFY_VOLUME (the
per-pod I/O limits are the mutable parameters: CreateVolume's ``mutable_parameters`` and ControllerModifyVolume);
with a backend that has snapshots also CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT and CLONE_VOLUME.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from google.protobuf.wrappers_pb2 import Int64Value

from nvmeof_csi.csi import capabilities, params, volume_id
from nvmeof_csi.csi.volume_health import volume_health
from nvmeof_csi.errors import InvalidArgument, NotFound, OutOfRange, Unimplemented
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.rpc.calls import blocking, require
from nvmeof_csi.service.contracts import ContentSource, Snapshot, Topology, TopologyRequirement, Volume, VolumeRef
from nvmeof_csi.service.provisioning import CapacityRange, VolumeService
from nvmeof_csi.service.records import AccessSpec

Ctx = grpc.aio.ServicerContext[Any, Any]
RPC = csi_pb2.ControllerServiceCapability.RPC

OFFERED = (
    RPC.CREATE_DELETE_VOLUME,
    RPC.PUBLISH_UNPUBLISH_VOLUME,
    RPC.LIST_VOLUMES,
    RPC.LIST_VOLUMES_PUBLISHED_NODES,
    RPC.GET_CAPACITY,
    RPC.EXPAND_VOLUME,
    RPC.GET_VOLUME,
    RPC.GET_VOLUME_HEALTH,
    RPC.LIST_VOLUME_HEALTH,
    RPC.SINGLE_NODE_MULTI_WRITER,
    RPC.PUBLISH_READONLY,
    RPC.MODIFY_VOLUME,
)


def _reason(value: int) -> str:
    """A CSI 1.14 unpublish reason by name; unset or one this spec does not know -> ``""``."""
    try:
        name = csi_pb2.ControllerUnpublishVolumeRequest.Reason.Name(value)
    except ValueError:
        return ""
    return "" if name == "UNKNOWN" else name


def _range(msg: csi_pb2.CapacityRange) -> CapacityRange:
    return CapacityRange(msg.required_bytes, msg.limit_bytes)


def _within_filesystem_floor(rng: CapacityRange, specs: Sequence[AccessSpec]) -> CapacityRange:
    """Raise a too-small requested size to the filesystem's minimum (XFS: 300 MiB); OUT_OF_RANGE when the
    limit does not allow that."""
    floor, fs_type = capabilities.filesystem_floor(specs)
    if rng.limit and rng.limit < floor:
        raise OutOfRange(f"capacity_range: {fs_type} needs at least {floor} bytes; limit_bytes is {rng.limit}")
    if 0 < rng.required < floor:
        return CapacityRange(floor, rng.limit)
    return rng


SNAPSHOT_RPCS = (RPC.CREATE_DELETE_SNAPSHOT, RPC.LIST_SNAPSHOTS, RPC.GET_SNAPSHOT, RPC.CLONE_VOLUME)


def _topologies(items: Sequence[Topology]) -> list[csi_pb2.Topology]:
    return [csi_pb2.Topology(segments=dict(t)) for t in items]


def _requirement(request: csi_pb2.CreateVolumeRequest) -> TopologyRequirement | None:
    if not request.HasField("accessibility_requirements"):
        return None
    req = request.accessibility_requirements
    return TopologyRequirement(
        tuple(dict(t.segments) for t in req.requisite), tuple(dict(t.segments) for t in req.preferred)
    )


def _source(request: csi_pb2.CreateVolumeRequest) -> ContentSource | None:
    if not request.HasField("volume_content_source"):
        return None
    kind = request.volume_content_source.WhichOneof("type")
    if kind == "snapshot":
        snap_id = request.volume_content_source.snapshot.snapshot_id
        return ContentSource("snapshot", volume_id.decode_snapshot(snap_id))
    if kind == "volume":
        return ContentSource("volume", volume_id.decode(request.volume_content_source.volume.volume_id))
    raise InvalidArgument("volume_content_source must name a snapshot or a volume")


def _source_msg(source: ContentSource) -> csi_pb2.VolumeContentSource:
    if source.kind == "snapshot":
        snap = csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=volume_id.encode_snapshot(source.ref))
        return csi_pb2.VolumeContentSource(snapshot=snap)
    vol = csi_pb2.VolumeContentSource.VolumeSource(volume_id=volume_id.encode(source.ref))
    return csi_pb2.VolumeContentSource(volume=vol)


def _snapshot_msg(snap: Snapshot) -> csi_pb2.Snapshot:
    created = Timestamp()
    created.FromNanoseconds(int(snap.created_at * 1e9))
    return csi_pb2.Snapshot(
        snapshot_id=volume_id.encode_snapshot(snap.ref),
        source_volume_id=volume_id.encode(snap.source),
        size_bytes=snap.size_bytes,
        creation_time=created,
        ready_to_use=snap.ready,
    )


class ControllerServicer(csi_pb2_grpc.ControllerServicer):
    def __init__(self, volumes: VolumeService) -> None:
        self._volumes = volumes

    def _volume_msg(self, volume: Volume) -> csi_pb2.Volume:
        return csi_pb2.Volume(
            volume_id=volume_id.encode(volume.ref),
            capacity_bytes=volume.capacity_bytes,
            volume_context=dict(volume.context),
            accessible_topology=_topologies(volume.accessible_topology),
            content_source=_source_msg(volume.source) if volume.source else None,
        )

    def _need_snapshots(self) -> None:
        if not self._volumes.supports_snapshots:
            raise Unimplemented("snapshots are not offered by this backend")

    async def CreateVolume(self, request: csi_pb2.CreateVolumeRequest, context: Ctx) -> csi_pb2.CreateVolumeResponse:
        require(request.name, "name")
        if len(request.name.encode()) > 128:
            raise InvalidArgument("name must be at most 128 bytes")
        specs = capabilities.check_all(request.volume_capabilities)
        options = params.parse(request.parameters).with_changes(params.mutable(request.mutable_parameters))
        if options.dataset is not None and any(s.fs_type not in ("", "ext4") for s in specs):
            raise InvalidArgument("dataset volumes are filled as ext4: fsType must be ext4 (or empty)")
        rng = _within_filesystem_floor(_range(request.capacity_range), specs)
        source = _source(request)
        if source is not None and not self._volumes.supports_snapshots:
            raise InvalidArgument("volume_content_source: snapshots and clones are not offered by this backend")
        volume = await blocking(  # a long fill holds this worker at most until the caller's deadline
            self._volumes.create, request.name, rng, options, _requirement(request), source, context.time_remaining()
        )
        return csi_pb2.CreateVolumeResponse(volume=self._volume_msg(volume))

    async def DeleteVolume(self, request: csi_pb2.DeleteVolumeRequest, context: Ctx) -> csi_pb2.DeleteVolumeResponse:
        try:
            ref = volume_id.decode(request.volume_id)
        except NotFound:
            return csi_pb2.DeleteVolumeResponse()  # not ours, so nothing to delete
        await blocking(self._volumes.delete, ref)
        return csi_pb2.DeleteVolumeResponse()

    async def ControllerPublishVolume(
        self, request: csi_pb2.ControllerPublishVolumeRequest, context: Ctx
    ) -> csi_pb2.ControllerPublishVolumeResponse:
        require(request.volume_id, "volume_id")
        require(request.node_id, "node_id")
        if not request.HasField("volume_capability"):
            raise InvalidArgument("volume_capability is required")
        capabilities.access_spec(request.volume_capability)
        ref = volume_id.decode(request.volume_id)
        readonly = request.readonly or capabilities.is_readonly_mode(request.volume_capability)
        one_node = capabilities.is_one_node_mode(request.volume_capability)
        publish_context = await blocking(
            self._volumes.publish, ref, request.node_id, readonly, dict(request.secrets), one_node
        )
        return csi_pb2.ControllerPublishVolumeResponse(publish_context=dict(publish_context))

    async def ControllerUnpublishVolume(
        self, request: csi_pb2.ControllerUnpublishVolumeRequest, context: Ctx
    ) -> csi_pb2.ControllerUnpublishVolumeResponse:
        try:
            ref = volume_id.decode(request.volume_id)
        except NotFound:
            return csi_pb2.ControllerUnpublishVolumeResponse()
        if request.node_id:
            await blocking(self._volumes.unpublish, ref, request.node_id, _reason(request.reason))
        else:  # no node: unpublish from every node (the CO may not give a reason then)
            volume = await blocking(self._volumes.get, ref)
            for node in volume.published_nodes:
                await blocking(self._volumes.unpublish, ref, node)
        return csi_pb2.ControllerUnpublishVolumeResponse()

    async def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: Ctx
    ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        require(request.volume_id, "volume_id")
        if not request.volume_capabilities:
            raise InvalidArgument("volume_capabilities must not be empty")
        ref = volume_id.decode(request.volume_id)
        volume = await blocking(self._volumes.get, ref)
        reasons = [r for r in (capabilities.unsupported_reason(c) for c in request.volume_capabilities) if r]
        if request.parameters and volume.parameters.immutable() != params.parse(request.parameters).immutable():
            reasons.append("parameters differ from those the volume was created with")
        if reasons:
            return csi_pb2.ValidateVolumeCapabilitiesResponse(message="; ".join(reasons))
        confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=request.volume_context,
            volume_capabilities=request.volume_capabilities,
            parameters=request.parameters,
        )
        return csi_pb2.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    async def ListVolumes(self, request: csi_pb2.ListVolumesRequest, context: Ctx) -> csi_pb2.ListVolumesResponse:
        page = await blocking(self._volumes.list, request.max_entries, request.starting_token)
        entries = [
            csi_pb2.ListVolumesResponse.Entry(
                volume=self._volume_msg(v),
                status=csi_pb2.ListVolumesResponse.VolumeStatus(published_node_ids=list(v.published_nodes)),
            )
            for v in page.volumes
        ]
        return csi_pb2.ListVolumesResponse(entries=entries, next_token=page.next_token)

    async def GetCapacity(self, request: csi_pb2.GetCapacityRequest, context: Ctx) -> csi_pb2.GetCapacityResponse:
        for cap in request.volume_capabilities:
            if capabilities.unsupported_reason(cap):
                return csi_pb2.GetCapacityResponse(available_capacity=0)
        segment: Mapping[str, str] | None = (
            dict(request.accessible_topology.segments) if request.HasField("accessible_topology") else None
        )
        available = await blocking(self._volumes.capacity, segment, params.parse(request.parameters))
        largest = await blocking(self._volumes.max_volume_size)
        return csi_pb2.GetCapacityResponse(
            available_capacity=available, maximum_volume_size=Int64Value(value=min(largest, available))
        )

    async def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: Ctx
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        offered = OFFERED + (SNAPSHOT_RPCS if self._volumes.supports_snapshots else ())
        caps = [csi_pb2.ControllerServiceCapability(rpc=RPC(type=t)) for t in offered]
        return csi_pb2.ControllerGetCapabilitiesResponse(capabilities=caps)

    async def ControllerExpandVolume(
        self, request: csi_pb2.ControllerExpandVolumeRequest, context: Ctx
    ) -> csi_pb2.ControllerExpandVolumeResponse:
        require(request.volume_id, "volume_id")
        if not request.HasField("capacity_range"):
            raise InvalidArgument("capacity_range is required")
        if request.HasField("volume_capability"):
            capabilities.access_spec(request.volume_capability)
        ref = volume_id.decode(request.volume_id)
        size = await blocking(self._volumes.expand, ref, _range(request.capacity_range))
        return csi_pb2.ControllerExpandVolumeResponse(capacity_bytes=size, node_expansion_required=True)

    async def ControllerGetVolume(
        self, request: csi_pb2.ControllerGetVolumeRequest, context: Ctx
    ) -> csi_pb2.ControllerGetVolumeResponse:
        ref: VolumeRef = volume_id.decode(request.volume_id)
        volume = await blocking(self._volumes.get, ref)
        status = csi_pb2.ControllerGetVolumeResponse.VolumeStatus(published_node_ids=list(volume.published_nodes))
        return csi_pb2.ControllerGetVolumeResponse(volume=self._volume_msg(volume), status=status)

    async def ControllerGetVolumeHealth(
        self, request: csi_pb2.ControllerGetVolumeHealthRequest, context: Ctx
    ) -> csi_pb2.ControllerGetVolumeHealthResponse:
        require(request.volume_id, "volume_id")
        ref = volume_id.decode(request.volume_id)
        condition = await blocking(self._volumes.condition, ref)
        return csi_pb2.ControllerGetVolumeHealthResponse(volume_health=volume_health(request.volume_id, condition))

    async def ControllerListVolumeHealth(
        self, request: csi_pb2.ControllerListVolumeHealthRequest, context: Ctx
    ) -> csi_pb2.ControllerListVolumeHealthResponse:
        page = await blocking(self._volumes.list, request.max_entries, request.starting_token)
        entries = []
        for volume in page.volumes:
            condition = await blocking(self._volumes.condition, volume.ref)
            entries.append(volume_health(volume_id.encode(volume.ref), condition))
        return csi_pb2.ControllerListVolumeHealthResponse(entries=entries, next_token=page.next_token)

    # -- snapshots (when the backend offers them) --------------------------------------------------------
    async def CreateSnapshot(
        self, request: csi_pb2.CreateSnapshotRequest, context: Ctx
    ) -> csi_pb2.CreateSnapshotResponse:
        self._need_snapshots()
        require(request.name, "name")
        if len(request.name.encode()) > 128:
            raise InvalidArgument("name must be at most 128 bytes")
        require(request.source_volume_id, "source_volume_id")
        source = volume_id.decode(request.source_volume_id)
        snap = await blocking(self._volumes.create_snapshot, request.name, source)
        return csi_pb2.CreateSnapshotResponse(snapshot=_snapshot_msg(snap))

    async def DeleteSnapshot(
        self, request: csi_pb2.DeleteSnapshotRequest, context: Ctx
    ) -> csi_pb2.DeleteSnapshotResponse:
        self._need_snapshots()
        require(request.snapshot_id, "snapshot_id")
        try:
            ref = volume_id.decode_snapshot(request.snapshot_id)
        except NotFound:
            return csi_pb2.DeleteSnapshotResponse()  # not ours, so nothing to delete
        await blocking(self._volumes.delete_snapshot, ref)
        return csi_pb2.DeleteSnapshotResponse()

    async def ListSnapshots(self, request: csi_pb2.ListSnapshotsRequest, context: Ctx) -> csi_pb2.ListSnapshotsResponse:
        self._need_snapshots()
        try:
            source = volume_id.decode(request.source_volume_id) if request.source_volume_id else None
            snap = volume_id.decode_snapshot(request.snapshot_id) if request.snapshot_id else None
        except NotFound:
            return csi_pb2.ListSnapshotsResponse()  # a filter no snapshot of ours can match
        page = await blocking(self._volumes.list_snapshots, request.max_entries, request.starting_token, source, snap)
        entries = [csi_pb2.ListSnapshotsResponse.Entry(snapshot=_snapshot_msg(s)) for s in page.snapshots]
        return csi_pb2.ListSnapshotsResponse(entries=entries, next_token=page.next_token)

    async def GetSnapshot(self, request: csi_pb2.GetSnapshotRequest, context: Ctx) -> csi_pb2.GetSnapshotResponse:
        self._need_snapshots()
        require(request.snapshot_id, "snapshot_id")
        ref = volume_id.decode_snapshot(request.snapshot_id)
        page = await blocking(self._volumes.list_snapshots, 1, "", None, ref)
        if not page.snapshots:
            raise NotFound(f"snapshot {request.snapshot_id} does not exist")
        return csi_pb2.GetSnapshotResponse(snapshot=_snapshot_msg(page.snapshots[0]))

    async def ControllerGetNodeInfo(
        self, request: csi_pb2.ControllerGetNodeInfoRequest, context: Ctx
    ) -> csi_pb2.ControllerGetNodeInfoResponse:
        """Not offered (GET_NODE_INFO is not a capability): a node's topology is what its own fabric reaches
        (its NICs, modules and soft-RoCE), which only the node sees; NodeGetInfo reports it."""
        raise Unimplemented("ControllerGetNodeInfo is not offered: NodeGetInfo reports each node's topology")

    async def ControllerModifyVolume(
        self, request: csi_pb2.ControllerModifyVolumeRequest, context: Ctx
    ) -> csi_pb2.ControllerModifyVolumeResponse:
        require(request.volume_id, "volume_id")
        changes = params.mutable(request.mutable_parameters)
        ref = volume_id.decode(request.volume_id)
        await blocking(self._volumes.modify, ref, changes)
        return csi_pb2.ControllerModifyVolumeResponse()
