"""CSI 1.14's unpublish reason end to end: the controller over gRPC, the agent backend, real agents on plain
configfs trees. NODE_OUT_OF_SERVICE fences (the agent records it and cycles the subsystem's port links), a repeat
changes nothing, the node is refused with FAILED_PRECONDITION until an operator unfences it; a clean unpublish
(NODE_CLEANUP_SUCCEEDED) only revokes the grant."""

from __future__ import annotations

import grpc
import pytest

from nvmeof_csi.gen import csi_pb2
from tests.component.test_agent_controller import FAB, NODE, Ctl, create_req, ctl
from tests.support.requests import mount_cap

__all__ = ["ctl"]
Reason = csi_pb2.ControllerUnpublishVolumeRequest.Reason


async def test_an_out_of_service_unpublish_fences_the_node_until_it_is_unfenced(ctl: Ctl) -> None:
    vol = (await ctl.stub.CreateVolume(create_req("fenced", requisite=[{FAB: "f2"}]))).volume
    uuid, agent = vol.volume_id.split(".")[-1], ctl.agents["store-c"].agent
    pub = csi_pb2.ControllerPublishVolumeRequest(volume_id=vol.volume_id, node_id=NODE, volume_capability=mount_cap())
    await ctl.stub.ControllerPublishVolume(pub)
    unpub = csi_pb2.ControllerUnpublishVolumeRequest(
        volume_id=vol.volume_id, node_id=NODE, reason=Reason.NODE_OUT_OF_SERVICE
    )
    for _ in range(2):  # a repeat changes nothing
        await ctl.stub.ControllerUnpublishVolume(unpub)
    record = agent.get_volume(uuid).record
    assert NODE not in record.hosts and record.fenced[NODE]["reason"] == "NODE_OUT_OF_SERVICE"
    assert agent.nvmet.allowed_hosts(vol.volume_context["nqn"]) == []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ctl.stub.ControllerPublishVolume(pub)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "nvmeofctl hosts unfence" in (info.value.details() or "")
    agent.unfence_host(uuid, NODE)  # what `nvmeofctl hosts unfence` does
    await ctl.stub.ControllerPublishVolume(pub)
    assert agent.nvmet.allowed_hosts(vol.volume_context["nqn"]) == [NODE]

    clean = csi_pb2.ControllerUnpublishVolumeRequest(
        volume_id=vol.volume_id, node_id=NODE, reason=Reason.NODE_CLEANUP_SUCCEEDED
    )
    await ctl.stub.ControllerUnpublishVolume(clean)
    assert agent.get_volume(uuid).record.fenced == {} and agent.nvmet.allowed_hosts(vol.volume_context["nqn"]) == []
