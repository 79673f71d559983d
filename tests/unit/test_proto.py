"""The generated module must carry every service and RPC of CSI spec v1.14."""

from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc, nvmeof_agent_pb2

EXPECTED = {
    "Identity": {"GetPluginInfo", "GetPluginCapabilities", "Probe"},
    "Controller": {
        "CreateVolume",
        "DeleteVolume",
        "ControllerPublishVolume",
        "ControllerUnpublishVolume",
        "ValidateVolumeCapabilities",
        "ListVolumes",
        "GetCapacity",
        "ControllerGetCapabilities",
        "CreateSnapshot",
        "DeleteSnapshot",
        "ListSnapshots",
        "GetSnapshot",
        "ControllerExpandVolume",
        "ControllerGetVolume",
        "ControllerModifyVolume",
        "ControllerGetVolumeHealth",
        "ControllerListVolumeHealth",
        "ControllerGetNodeInfo",
    },
    "GroupController": {
        "GroupControllerGetCapabilities",
        "CreateVolumeGroupSnapshot",
        "DeleteVolumeGroupSnapshot",
        "GetVolumeGroupSnapshot",
    },
    "SnapshotMetadata": {"GetMetadataAllocated", "GetMetadataDelta"},
    "Node": {
        "NodeStageVolume",
        "NodeUnstageVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeGetVolumeStats",
        "NodeExpandVolume",
        "NodeGetCapabilities",
        "NodeGetInfo",
        "NodeGetVolumeHealth",
        "NodeGetStorageHealth",
    },
}


def test_every_service_and_rpc() -> None:
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    services = csi_pb2.DESCRIPTOR.services_by_name
    assert set(services) == set(EXPECTED)
    for name, rpcs in EXPECTED.items():
        assert set(services[name].methods_by_name) == rpcs, name
        assert hasattr(csi_pb2_grpc, f"{name}Servicer")
        assert hasattr(csi_pb2_grpc, f"add_{name}Servicer_to_server")


def test_our_agent_api_is_generated() -> None:
    assert "Agent" in nvmeof_agent_pb2.DESCRIPTOR.services_by_name


def test_the_unpublish_reason_of_spec_1_14() -> None:
    reason = csi_pb2.ControllerUnpublishVolumeRequest.Reason
    assert {reason.Name(v) for v in reason.values()} == {
        "UNKNOWN",
        "NODE_CLEANUP_SUCCEEDED",
        "NODE_CLEANUP_TIMEOUT",
        "NODE_OUT_OF_SERVICE",
    }
