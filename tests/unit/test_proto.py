"""The generated module must carry every service and RPC of CSI spec v1.13."""

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
