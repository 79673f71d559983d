"""CSI Node service: validate, call :class:`StagingService`, build the reply.

Capabilities: STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS, EXPAND_VOLUME, SINGLE_NODE_MULTI_WRITER, and the CSI 1.13
alpha GET_VOLUME_HEALTH (the paths of a staged volume: DEGRADED naming the lost ones, INACCESSIBLE when none
is live) and GET_STORAGE_HEALTH (the node's initiator: modules, native multipath).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import grpc

from nvmeof_csi.csi import capabilities, volume_id
from nvmeof_csi.csi.volume_health import volume_health
from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.rpc.calls import blocking, remaining, require
from nvmeof_csi.service.qos import pod_uid_of
from nvmeof_csi.service.staging import StagingService

Ctx = grpc.aio.ServicerContext[Any, Any]
NodeRPC = csi_pb2.NodeServiceCapability.RPC

OFFERED = (
    NodeRPC.STAGE_UNSTAGE_VOLUME,
    NodeRPC.GET_VOLUME_STATS,
    NodeRPC.EXPAND_VOLUME,
    NodeRPC.GET_VOLUME_HEALTH,
    NodeRPC.GET_STORAGE_HEALTH,
    NodeRPC.SINGLE_NODE_MULTI_WRITER,
)


class NodeServicer(csi_pb2_grpc.NodeServicer):
    def __init__(self, staging: StagingService, node_id: str, max_volumes: int, topology: Mapping[str, str]) -> None:
        self._staging = staging
        self._node_id = node_id
        self._max_volumes = max_volumes
        self._topology = dict(topology)

    async def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: Ctx
    ) -> csi_pb2.NodeStageVolumeResponse:
        require(request.volume_id, "volume_id")
        require(request.staging_target_path, "staging_target_path")
        if not request.HasField("volume_capability"):
            raise InvalidArgument("volume_capability is required")
        access = capabilities.access_spec(request.volume_capability)
        if request.publish_context.get("readonly") == "true":  # attached read-only by ControllerPublishVolume
            access = replace(access, readonly=True)
        ref = volume_id.decode(request.volume_id)
        volume_context = {**request.volume_context, **request.publish_context}
        await blocking(
            self._staging.stage,
            request.volume_id,
            ref,
            request.staging_target_path,
            access,
            volume_context,
            remaining(context),
            dict(request.secrets),
        )
        return csi_pb2.NodeStageVolumeResponse()

    async def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: Ctx
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        require(request.volume_id, "volume_id")
        require(request.staging_target_path, "staging_target_path")
        ref = volume_id.decode(request.volume_id)
        await blocking(self._staging.unstage, ref, request.staging_target_path)
        return csi_pb2.NodeUnstageVolumeResponse()

    async def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: Ctx
    ) -> csi_pb2.NodePublishVolumeResponse:
        require(request.volume_id, "volume_id")
        require(request.target_path, "target_path")
        require(request.staging_target_path, "staging_target_path")
        if not request.HasField("volume_capability"):
            raise InvalidArgument("volume_capability is required")
        access = capabilities.access_spec(request.volume_capability)
        ref = volume_id.decode(request.volume_id)
        readonly = request.readonly or capabilities.is_readonly_mode(request.volume_capability)
        await blocking(
            self._staging.publish,
            ref,
            request.staging_target_path,
            request.target_path,
            access,
            readonly,
            pod_uid_of(request.volume_context),
        )
        return csi_pb2.NodePublishVolumeResponse()

    async def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: Ctx
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        require(request.volume_id, "volume_id")
        require(request.target_path, "target_path")
        ref = volume_id.decode(request.volume_id)
        await blocking(self._staging.unpublish, ref, request.target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    async def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: Ctx
    ) -> csi_pb2.NodeGetVolumeStatsResponse:
        require(request.volume_id, "volume_id")
        require(request.volume_path, "volume_path")
        ref = volume_id.decode(request.volume_id)
        stats = await blocking(self._staging.stats, ref, request.volume_path)
        Unit = csi_pb2.VolumeUsage.Unit
        if stats.usage is None:
            usage = [csi_pb2.VolumeUsage(unit=Unit.BYTES, total=stats.capacity_bytes)]
        else:
            u = stats.usage
            usage = [
                csi_pb2.VolumeUsage(
                    unit=Unit.BYTES, total=u.total_bytes, available=u.available_bytes, used=u.used_bytes
                ),
                csi_pb2.VolumeUsage(
                    unit=Unit.INODES, total=u.total_inodes, available=u.free_inodes, used=u.used_inodes
                ),
            ]
        return csi_pb2.NodeGetVolumeStatsResponse(usage=usage)

    async def NodeGetVolumeHealth(
        self, request: csi_pb2.NodeGetVolumeHealthRequest, context: Ctx
    ) -> csi_pb2.NodeGetVolumeHealthResponse:
        require(request.volume_id, "volume_id")
        for path, field in (
            (request.volume_publish_path, "volume_publish_path"),
            (request.staging_target_path, "staging_target_path"),
        ):
            if path and not path.startswith("/"):
                raise InvalidArgument(f"{field} must be an absolute path")
        ref = volume_id.decode(request.volume_id)
        condition = await blocking(self._staging.health, ref)
        return csi_pb2.NodeGetVolumeHealthResponse(volume_health=volume_health(request.volume_id, condition))

    async def NodeGetStorageHealth(
        self, request: csi_pb2.NodeGetStorageHealthRequest, context: Ctx
    ) -> csi_pb2.NodeGetStorageHealthResponse:
        Backend = csi_pb2.NodeGetStorageHealthResponse.StorageBackendHealth
        health = await blocking(self._staging.storage_health)
        entries = (
            []
            if health.ready
            else [Backend(status=csi_pb2.STORAGE_UNREACHABLE, reason="InitiatorNotReady", message=health.message)]
        )
        entries += [
            Backend(status=csi_pb2.STORAGE_DEGRADED, reason="FeatureUnavailable", message=g) for g in health.gaps
        ]
        aside = await blocking(self._staging.quarantined_records)
        if aside:
            message = f"{len(aside)} staging record(s) set aside, their volumes not reconciled: {', '.join(aside[:5])}"
            entries.append(Backend(status=csi_pb2.STORAGE_DEGRADED, reason="StagingRecordQuarantined", message=message))
        return csi_pb2.NodeGetStorageHealthResponse(backend_health=entries)

    async def NodeExpandVolume(
        self, request: csi_pb2.NodeExpandVolumeRequest, context: Ctx
    ) -> csi_pb2.NodeExpandVolumeResponse:
        require(request.volume_id, "volume_id")
        require(request.volume_path, "volume_path")
        if request.HasField("volume_capability"):
            capabilities.access_spec(request.volume_capability)
        ref = volume_id.decode(request.volume_id)
        size = await blocking(self._staging.expand, ref, request.volume_path)
        return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=size)

    async def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: Ctx
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        caps = [csi_pb2.NodeServiceCapability(rpc=NodeRPC(type=t)) for t in OFFERED]
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=caps)

    async def NodeGetInfo(self, request: csi_pb2.NodeGetInfoRequest, context: Ctx) -> csi_pb2.NodeGetInfoResponse:
        topology = csi_pb2.Topology(segments=self._topology) if self._topology else None
        return csi_pb2.NodeGetInfoResponse(
            node_id=self._node_id, max_volumes_per_node=self._max_volumes, accessible_topology=topology
        )
