"""The loop backend's target side (files and records only; no root needed)."""

from pathlib import Path

import pytest

from nvmeof_csi.errors import AlreadyExists, FailedPrecondition, NotFound, ResourceExhausted
from nvmeof_csi.loop.backend import CTX_PATH, LoopTargetBackend
from nvmeof_csi.nvmeof.parameters import VolumeParameters

TOPO = {"topology.csi.nvmeof.io/fabric": "f1"}


def test_lifecycle(tmp_path: Path) -> None:
    b = LoopTargetBackend(tmp_path, 10 << 30, TOPO)
    assert b.health().ready
    v = b.create_volume("pvc", 1 << 30, VolumeParameters.parse({"queueSize": "64"}))
    image = Path(v.context[CTX_PATH])
    assert image.stat().st_size == 1 << 30 and image.stat().st_blocks == 0  # sparse
    assert b.create_volume("pvc", 1 << 30, VolumeParameters.parse({"queueSize": "64"})) == v
    assert b.find_volume_by_name("pvc") == v and b.get_volume(v.ref) == v
    assert v.accessible_topology == (TOPO,)
    b.publish(v.ref, "n1", False)
    with pytest.raises(AlreadyExists):
        b.publish(v.ref, "n1", True)
    with pytest.raises(FailedPrecondition, match="published"):
        b.delete_volume(v.ref)
    b.unpublish(v.ref, "n1")
    assert b.expand_volume(v.ref, 2 << 30) == 2 << 30 and image.stat().st_size == 2 << 30
    assert b.expand_volume(v.ref, 1) == 2 << 30
    b.delete_volume(v.ref)
    b.delete_volume(v.ref)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(NotFound):
        b.expand_volume(v.ref, 3 << 30)


def test_capacity_and_segments(tmp_path: Path) -> None:
    b = LoopTargetBackend(tmp_path, 3 << 30, TOPO)
    b.create_volume("a", 2 << 30, VolumeParameters.parse({}))
    with pytest.raises(ResourceExhausted):
        b.create_volume("b", 2 << 30, VolumeParameters.parse({}))
    assert b.available_capacity(None) == 1 << 30
    assert b.available_capacity({"topology.csi.nvmeof.io/fabric": "other"}) == 0


def test_state_survives_a_new_instance(tmp_path: Path) -> None:
    v = LoopTargetBackend(tmp_path, 3 << 30, TOPO).create_volume("a", 1 << 20, VolumeParameters.parse({}))
    assert LoopTargetBackend(tmp_path, 3 << 30, TOPO).find_volume_by_name("a") == v


def test_loop_backend_refuses_dataset_volumes(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="cannot fill dataset volumes"):
        LoopTargetBackend(tmp_path, 3 << 30, TOPO).create_volume(
            "d", 1 << 20, VolumeParameters.parse({"dataset.uri": "/srv/d"})
        )
    assert LoopTargetBackend(tmp_path, 3 << 30, TOPO).list_volumes() == []
