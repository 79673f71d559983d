"""CSI request builders shared by the servicer tests, and the table of malformed requests every servicer stack
must refuse with the right code (never INTERNAL)."""

from __future__ import annotations

import uuid

from nvmeof_csi.gen import csi_pb2

Mode = csi_pb2.VolumeCapability.AccessMode


def mount_cap(mode: int = Mode.SINGLE_NODE_WRITER, fs: str = "ext4") -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        access_mode=Mode(mode=mode),  # type: ignore[arg-type]
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs),
    )


def block_cap(mode: int = Mode.SINGLE_NODE_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        access_mode=Mode(mode=mode),  # type: ignore[arg-type]
        block=csi_pb2.VolumeCapability.BlockVolume(),
    )


GOOD_ID = "nvmeof-v1.fake." + str(uuid.UUID(int=1))
C = "controller"
N = "node"
BAD = [
    (C, "CreateVolume", csi_pb2.CreateVolumeRequest(volume_capabilities=[mount_cap()]), "INVALID_ARGUMENT", "name"),
    (C, "CreateVolume", csi_pb2.CreateVolumeRequest(name="a"), "INVALID_ARGUMENT", "volume_capabilities"),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(name="n" * 129, volume_capabilities=[mount_cap()]),
        "INVALID_ARGUMENT",
        "128",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="a", volume_capabilities=[mount_cap()], capacity_range=csi_pb2.CapacityRange(required_bytes=-1)
        ),
        "INVALID_ARGUMENT",
        "negative",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="a",
            volume_capabilities=[mount_cap()],
            capacity_range=csi_pb2.CapacityRange(required_bytes=10, limit_bytes=5),
        ),
        "INVALID_ARGUMENT",
        "larger than limit",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(name="a", volume_capabilities=[mount_cap()], parameters={"bogus": "1"}),
        "INVALID_ARGUMENT",
        "bogus",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(name="a", volume_capabilities=[mount_cap(fs="ntfs")]),
        "INVALID_ARGUMENT",
        "ntfs",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(name="a", volume_capabilities=[mount_cap(Mode.MULTI_NODE_MULTI_WRITER)]),
        "INVALID_ARGUMENT",
        "MULTI_NODE_MULTI_WRITER",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="a", volume_capabilities=[mount_cap()], capacity_range=csi_pb2.CapacityRange(required_bytes=1 << 50)
        ),
        "OUT_OF_RANGE",
        "largest",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="a",
            volume_capabilities=[mount_cap(fs="xfs")],
            capacity_range=csi_pb2.CapacityRange(required_bytes=64 << 20, limit_bytes=100 << 20),
        ),
        "OUT_OF_RANGE",
        "xfs needs at least 314572800 bytes",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="a", volume_capabilities=[mount_cap(fs="xfs")], parameters={"dataset.uri": "/d"}
        ),
        "INVALID_ARGUMENT",
        "filled as ext4",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="a", volume_capabilities=[mount_cap()], parameters={"dataset.uri": "/d", "dataset.ttl": "x"}
        ),
        "INVALID_ARGUMENT",
        "dataset.ttl",
    ),
    (
        C,
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="a",
            volume_capabilities=[mount_cap()],
            accessibility_requirements=csi_pb2.TopologyRequirement(
                requisite=[csi_pb2.Topology(segments={"topology.csi.nvmeof.io/fabric": "elsewhere"})]
            ),
        ),
        "RESOURCE_EXHAUSTED",
        "topology",
    ),
    (C, "DeleteVolume", csi_pb2.DeleteVolumeRequest(), "INVALID_ARGUMENT", "volume_id"),
    (
        C,
        "ControllerPublishVolume",
        csi_pb2.ControllerPublishVolumeRequest(node_id="node-1", volume_capability=mount_cap()),
        "INVALID_ARGUMENT",
        "volume_id",
    ),
    (
        C,
        "ControllerPublishVolume",
        csi_pb2.ControllerPublishVolumeRequest(volume_id=GOOD_ID, volume_capability=mount_cap()),
        "INVALID_ARGUMENT",
        "node_id",
    ),
    (
        C,
        "ControllerPublishVolume",
        csi_pb2.ControllerPublishVolumeRequest(volume_id=GOOD_ID, node_id="node-1"),
        "INVALID_ARGUMENT",
        "volume_capability",
    ),
    (
        C,
        "ControllerPublishVolume",
        csi_pb2.ControllerPublishVolumeRequest(volume_id=GOOD_ID, node_id="node-1", volume_capability=mount_cap()),
        "NOT_FOUND",
        "does not exist",
    ),
    (
        C,
        "ControllerPublishVolume",
        csi_pb2.ControllerPublishVolumeRequest(volume_id="x" * 129, node_id="node-1", volume_capability=mount_cap()),
        "INVALID_ARGUMENT",
        "128",
    ),
    (C, "ControllerUnpublishVolume", csi_pb2.ControllerUnpublishVolumeRequest(), "INVALID_ARGUMENT", "volume_id"),
    (
        C,
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_capabilities=[mount_cap()]),
        "INVALID_ARGUMENT",
        "volume_id",
    ),
    (
        C,
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=GOOD_ID),
        "INVALID_ARGUMENT",
        "volume_capabilities",
    ),
    (
        C,
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=GOOD_ID, volume_capabilities=[mount_cap()]),
        "NOT_FOUND",
        "does not exist",
    ),
    (C, "ListVolumes", csi_pb2.ListVolumesRequest(starting_token="not-a-token"), "ABORTED", "starting_token"),
    (C, "ListVolumes", csi_pb2.ListVolumesRequest(max_entries=-1), "INVALID_ARGUMENT", "max_entries"),
    (
        C,
        "ControllerExpandVolume",
        csi_pb2.ControllerExpandVolumeRequest(volume_id=GOOD_ID),
        "INVALID_ARGUMENT",
        "capacity_range",
    ),
    (
        C,
        "ControllerExpandVolume",
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=GOOD_ID, capacity_range=csi_pb2.CapacityRange(required_bytes=1)
        ),
        "NOT_FOUND",
        "does not exist",
    ),
    (C, "ControllerGetVolume", csi_pb2.ControllerGetVolumeRequest(volume_id="bogus"), "NOT_FOUND", "not an ID"),
    (
        C,
        "CreateSnapshot",
        csi_pb2.CreateSnapshotRequest(name="s", source_volume_id=GOOD_ID),
        "UNIMPLEMENTED",
        "snapshots",
    ),
    (
        C,
        "ControllerModifyVolume",
        csi_pb2.ControllerModifyVolumeRequest(volume_id=GOOD_ID),
        "NOT_FOUND",
        "does not exist",
    ),
    (
        C,
        "ControllerModifyVolume",
        csi_pb2.ControllerModifyVolumeRequest(volume_id=GOOD_ID, mutable_parameters={"tos": "8"}),
        "INVALID_ARGUMENT",
        "not mutable",
    ),
    (
        C,
        "ControllerModifyVolume",
        csi_pb2.ControllerModifyVolumeRequest(mutable_parameters={"readIops": "8"}),
        "INVALID_ARGUMENT",
        "volume_id",
    ),
    (
        N,
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(staging_target_path="/s", volume_capability=mount_cap()),
        "INVALID_ARGUMENT",
        "volume_id",
    ),
    (
        N,
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(volume_id=GOOD_ID, volume_capability=mount_cap()),
        "INVALID_ARGUMENT",
        "staging_target_path",
    ),
    (
        N,
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(volume_id=GOOD_ID, staging_target_path="/s"),
        "INVALID_ARGUMENT",
        "volume_capability",
    ),
    (
        N,
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(volume_id="some-id", staging_target_path="/s", volume_capability=mount_cap()),
        "NOT_FOUND",
        "not an ID",
    ),
    (
        N,
        "NodePublishVolume",
        csi_pb2.NodePublishVolumeRequest(volume_id=GOOD_ID, staging_target_path="/s", volume_capability=mount_cap()),
        "INVALID_ARGUMENT",
        "target_path",
    ),
    (
        N,
        "NodePublishVolume",
        csi_pb2.NodePublishVolumeRequest(volume_id=GOOD_ID, target_path="/t", volume_capability=mount_cap()),
        "INVALID_ARGUMENT",
        "staging_target_path",
    ),
    (
        N,
        "NodePublishVolume",
        csi_pb2.NodePublishVolumeRequest(
            volume_id=GOOD_ID, target_path="/t", staging_target_path="/s", volume_capability=mount_cap()
        ),
        "INVALID_ARGUMENT",
        "is not under",
    ),
    (
        N,
        "NodeUnpublishVolume",
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=GOOD_ID),
        "INVALID_ARGUMENT",
        "target_path",
    ),
    (
        N,
        "NodeUnstageVolume",
        csi_pb2.NodeUnstageVolumeRequest(volume_id=GOOD_ID),
        "INVALID_ARGUMENT",
        "staging_target_path",
    ),
    (N, "NodeGetVolumeStats", csi_pb2.NodeGetVolumeStatsRequest(volume_id=GOOD_ID), "INVALID_ARGUMENT", "volume_path"),
    (
        N,
        "NodeGetVolumeStats",
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=GOOD_ID, volume_path="/p"),
        "NOT_FOUND",
        "is not at",
    ),
    (N, "NodeExpandVolume", csi_pb2.NodeExpandVolumeRequest(volume_id=GOOD_ID), "INVALID_ARGUMENT", "volume_path"),
]
