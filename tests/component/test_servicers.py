"""The CSI servicers driven with real protobuf messages over a real (in-process) gRPC channel."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from nvmeof_csi import DRIVER_NAME, __version__
from nvmeof_csi.gen import csi_pb2
from tests.support.requests import BAD, C, block_cap, mount_cap
from tests.support.stack import Stack

Mode = csi_pb2.VolumeCapability.AccessMode
GiB = 1 << 30


async def create(stack: Stack, name: str = "pvc-1", size: int = GiB) -> csi_pb2.Volume:
    resp = await stack.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name=name, capacity_range=csi_pb2.CapacityRange(required_bytes=size), volume_capabilities=[mount_cap()]
        )
    )
    return resp.volume


async def test_identity(stack: Stack) -> None:
    info = await stack.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert (info.name, info.vendor_version) == (DRIVER_NAME, __version__)
    caps = await stack.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    kinds = {c.service.type for c in caps.capabilities}
    Service = csi_pb2.PluginCapability.Service
    assert kinds == {Service.CONTROLLER_SERVICE, Service.VOLUME_ACCESSIBILITY_CONSTRAINTS}
    assert (await stack.identity.Probe(csi_pb2.ProbeRequest())).ready.value is True
    stack.backend.healthy = False
    assert (await stack.identity.Probe(csi_pb2.ProbeRequest())).ready.value is False


async def test_full_lifecycle_and_every_repeat_is_harmless(stack: Stack) -> None:
    vol = await create(stack)
    assert (await create(stack)).volume_id == vol.volume_id
    assert vol.capacity_bytes == GiB
    assert dict(vol.accessible_topology[0].segments) == {"topology.csi.nvmeof.io/fabric": "f1"}
    pub = csi_pb2.ControllerPublishVolumeRequest(
        volume_id=vol.volume_id, node_id="node-1", volume_capability=mount_cap()
    )
    ctx1 = (await stack.controller.ControllerPublishVolume(pub)).publish_context
    ctx2 = (await stack.controller.ControllerPublishVolume(pub)).publish_context
    assert ctx1 == ctx2
    staging = str(stack.tmp / "staging")
    target = str(stack.tmp / "target")
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.volume_id,
        staging_target_path=staging,
        volume_capability=mount_cap(),
        publish_context=ctx1,
        volume_context=vol.volume_context,
    )
    await stack.node.NodeStageVolume(stage)
    await stack.node.NodeStageVolume(stage)
    publish = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.volume_id, staging_target_path=staging, target_path=target, volume_capability=mount_cap()
    )
    await stack.node.NodePublishVolume(publish)
    await stack.node.NodePublishVolume(publish)
    stats = await stack.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.volume_id, volume_path=target)
    )
    assert {u.unit for u in stats.usage} == {csi_pb2.VolumeUsage.BYTES, csi_pb2.VolumeUsage.INODES}
    node_health = await stack.node.NodeGetVolumeHealth(csi_pb2.NodeGetVolumeHealthRequest(volume_id=vol.volume_id))
    assert node_health.volume_health.volume_id == vol.volume_id and not node_health.volume_health.health_statuses
    ctl_health = await stack.controller.ControllerGetVolumeHealth(
        csi_pb2.ControllerGetVolumeHealthRequest(volume_id=vol.volume_id)
    )
    assert not ctl_health.volume_health.health_statuses
    listed = await stack.controller.ListVolumes(csi_pb2.ListVolumesRequest())
    assert [e.status.published_node_ids for e in listed.entries] == [["node-1"]]
    expand = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB)
    )
    assert (await stack.controller.ControllerExpandVolume(expand)).capacity_bytes == 2 * GiB
    node_exp = csi_pb2.NodeExpandVolumeRequest(volume_id=vol.volume_id, volume_path=target)
    assert (await stack.node.NodeExpandVolume(node_exp)).capacity_bytes == GiB  # the fake connector's size
    for _ in range(2):
        await stack.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol.volume_id, target_path=target)
        )
    for _ in range(2):
        await stack.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.volume_id, staging_target_path=staging)
        )
    unpub = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id, node_id="node-1")
    for _ in range(2):
        await stack.controller.ControllerUnpublishVolume(unpub)
    for _ in range(2):
        await stack.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id))
    assert stack.backend.volumes == {}
    assert stack.host.mountinfo.read_text().strip() == ""


@pytest.mark.parametrize(
    ("side", "rpc", "request_msg", "code", "needle"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)]
)
async def test_malformed_requests_get_the_spec_code(
    stack: Stack, side: str, rpc: str, request_msg: object, code: str, needle: str
) -> None:
    stub = stack.controller if side == C else stack.node
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await getattr(stub, rpc)(request_msg)
    assert info.value.code().name == code, info.value.details()
    assert needle in (info.value.details() or "")


async def test_busy_name_is_aborted_then_succeeds(stack: Stack) -> None:
    import threading

    stack.backend.gate = threading.Event()
    first = asyncio.ensure_future(create(stack, "racy"))
    await asyncio.to_thread(stack.backend.entered.wait, 5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await create(stack, "racy")
    assert info.value.code() == grpc.StatusCode.ABORTED
    stack.backend.gate.set()
    vol = await first
    assert (await create(stack, "racy")).volume_id == vol.volume_id
    assert len(stack.backend.volumes) == 1


async def test_a_caller_that_gives_up_leaves_the_lock_held_until_the_work_ends(stack: Stack) -> None:
    """Before, the edge released a volume's lock as soon as the caller's deadline passed, while the work went on
    in its worker thread: a retry then ran a second, concurrent CreateVolume on the same name."""
    import threading

    stack.backend.gate = threading.Event()
    request = csi_pb2.CreateVolumeRequest(name="slow", volume_capabilities=[mount_cap()])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.controller.CreateVolume(request, timeout=0.5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await asyncio.to_thread(stack.backend.entered.wait, 10)
    for _ in range(3):  # the first create is still running: every retry is refused, none runs beside it
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.controller.CreateVolume(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.ABORTED
    stack.backend.gate.set()
    for _ in range(50):  # the lock goes once the first create really ended
        try:
            vol = (await stack.controller.CreateVolume(request, timeout=5)).volume
            break
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.ABORTED
            await asyncio.sleep(0.1)
    assert vol.volume_id and len(stack.backend.volumes) == 1


async def test_probe_answers_while_every_worker_thread_is_busy(stack: Stack) -> None:
    import threading

    stack.backend.gate = threading.Event()
    stuck = [asyncio.ensure_future(create(stack, f"slow-{i}")) for i in range(40)]  # more than the shared pool
    await asyncio.sleep(0.5)
    try:
        reply = await stack.identity.Probe(csi_pb2.ProbeRequest(), timeout=3)
        assert reply.ready.value
    finally:
        stack.backend.gate.set()
        await asyncio.gather(*stuck, return_exceptions=True)


async def test_unexpected_exception_is_internal_with_traceback(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    def broken(name: str, *args: object) -> None:
        raise KeyError("bug in backend")

    stack.backend.find_volume_by_name = broken  # type: ignore[assignment,method-assign]
    with caplog.at_level(logging.INFO), pytest.raises(grpc.aio.AioRpcError) as info:
        await create(stack, "x")
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert any(r.exc_info and "bug in backend" in str(r.exc_info[1]) for r in caplog.records)


async def test_log_lines_in_and_out_without_secrets(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nvmeof_csi.rpc"):
        await stack.controller.CreateVolume(
            csi_pb2.CreateVolumeRequest(name="s1", volume_capabilities=[mount_cap()], secrets={"key": "TOPSECRET"})
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "nvmeof_csi.rpc"]
    assert lines[0].startswith("> CreateVolume") and lines[-1].startswith("< CreateVolume OK")
    assert all("TOPSECRET" not in line for line in lines)
    assert "s" in lines[-1].split()[3]  # duration like 0.004s


async def test_the_out_line_carries_the_response_only_at_debug(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    async def out_line(level: int, name: str) -> str:
        caplog.clear()
        with caplog.at_level(level, logger="nvmeof_csi.rpc"):
            await stack.controller.CreateVolume(
                csi_pb2.CreateVolumeRequest(name=name, volume_capabilities=[mount_cap()])
            )
        return [r.getMessage() for r in caplog.records if r.name == "nvmeof_csi.rpc"][-1]

    assert "volume_id" not in await out_line(logging.INFO, "quiet")
    assert "volume_id" in await out_line(logging.DEBUG, "chatty")


async def test_node_info_and_capabilities(stack: Stack) -> None:
    info = await stack.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.node_id == "node-1"
    assert dict(info.accessible_topology.segments) == {"topology.csi.nvmeof.io/fabric": "f1"}
    caps = await stack.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    R = csi_pb2.NodeServiceCapability.RPC
    got = {c.rpc.type for c in caps.capabilities}
    assert {R.STAGE_UNSTAGE_VOLUME, R.GET_VOLUME_STATS, R.EXPAND_VOLUME} <= got
    ccaps = await stack.controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest())
    CR = csi_pb2.ControllerServiceCapability.RPC
    cgot = {c.rpc.type for c in ccaps.capabilities}
    assert {
        CR.CREATE_DELETE_VOLUME,
        CR.PUBLISH_UNPUBLISH_VOLUME,
        CR.LIST_VOLUMES,
        CR.GET_CAPACITY,
        CR.EXPAND_VOLUME,
    } <= cgot


async def test_validate_and_capacity(stack: Stack) -> None:
    vol = await create(stack)
    ok = await stack.controller.ValidateVolumeCapabilities(
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=vol.volume_id, volume_capabilities=[mount_cap()])
    )
    assert ok.HasField("confirmed")
    no = await stack.controller.ValidateVolumeCapabilities(
        csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=vol.volume_id, volume_capabilities=[mount_cap(Mode.MULTI_NODE_MULTI_WRITER)]
        )
    )
    assert not no.HasField("confirmed") and "MULTI_NODE_MULTI_WRITER" in no.message
    cap = await stack.controller.GetCapacity(csi_pb2.GetCapacityRequest())
    assert cap.available_capacity == 99 * GiB
    other = await stack.controller.GetCapacity(
        csi_pb2.GetCapacityRequest(
            accessible_topology=csi_pb2.Topology(segments={"topology.csi.nvmeof.io/fabric": "x"})
        )
    )
    assert other.available_capacity == 0


async def test_xfs_volume_is_raised_to_the_filesystem_minimum(stack: Stack) -> None:
    """xfsprogs refuses XFS below 300 MiB: a smaller request gets 300 MiB (the spec allows more than required)."""
    small = csi_pb2.CapacityRange(required_bytes=64 << 20)
    xfs = await stack.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(name="x", capacity_range=small, volume_capabilities=[mount_cap(fs="xfs")])
    )
    assert xfs.volume.capacity_bytes == 300 << 20
    ext4 = await stack.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(name="e", capacity_range=small, volume_capabilities=[mount_cap()])
    )
    raw = await stack.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(name="b", capacity_range=small, volume_capabilities=[block_cap()])
    )
    assert ext4.volume.capacity_bytes == raw.volume.capacity_bytes == 64 << 20


async def test_node_storage_health_names_the_staging_records_set_aside(stack: Stack) -> None:
    health = await stack.node.NodeGetStorageHealth(csi_pb2.NodeGetStorageHealthRequest())
    assert list(health.backend_health) == []
    (stack.tmp / "rec").mkdir(exist_ok=True)
    (stack.tmp / "rec" / "fake.0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01.json.corrupt-1700000000").write_text("{")
    health = await stack.node.NodeGetStorageHealth(csi_pb2.NodeGetStorageHealthRequest())
    assert [(h.status, h.reason) for h in health.backend_health] == [
        (csi_pb2.STORAGE_DEGRADED, "StagingRecordQuarantined")
    ]
    assert "0b6d5bd6" in health.backend_health[0].message


async def test_node_storage_health_names_each_feature_the_node_was_asked_for_and_lacks(stack: Stack) -> None:
    stack.connector.gaps = ("rdma: the nvme-rdma module is neither loaded nor installed (fix: modprobe nvme-rdma)",)
    health = await stack.node.NodeGetStorageHealth(csi_pb2.NodeGetStorageHealthRequest())
    assert [(h.status, h.reason) for h in health.backend_health] == [(csi_pb2.STORAGE_DEGRADED, "FeatureUnavailable")]
    assert "modprobe nvme-rdma" in health.backend_health[0].message
