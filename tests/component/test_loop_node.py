"""The loop development backend end to end on the host: real losetup, mkfs, mount, bind mounts.
Asserts data survives unstage/restage and that expansion reaches the filesystem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.filesystems import Filesystems, usage
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.loop.backend import LoopTargetBackend
from nvmeof_csi.loop.connector import LoopConnector
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.records import AccessSpec, StagingStore
from nvmeof_csi.service.staging import StagingService
from tests.support.env import root_with_loop

MiB = 1 << 20
CAP_SYS_RESOURCE = 24


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


@pytest.fixture
def parts(tmp_path: Path):  # type: ignore[no-untyped-def]
    root_with_loop()
    ex = SubprocessExecutor()
    backend = LoopTargetBackend(tmp_path / "vols", 1 << 34, {})
    svc = StagingService(LoopConnector(ex), Mounter(ex), Filesystems(ex), StagingStore(tmp_path / "rec"), root=tmp_path)
    yield backend, svc, tmp_path
    mounter = Mounter(ex)
    for m in reversed(mounter.mounts()):
        if m.mount_point.startswith(str(tmp_path)):
            ex.run(["umount", "-l", m.mount_point], timeout=30, check=False)
    for vol in backend.list_volumes():
        LoopConnector(ex).disconnect(vol.ref, vol.context, frozenset())


@pytest.mark.root
@pytest.mark.parametrize("fs", ["ext4", "xfs"])
def test_data_survives_restage_and_expand_grows_fs(parts, fs: str) -> None:  # type: ignore[no-untyped-def]
    backend, svc, tmp = parts
    vol = backend.create_volume("pvc", 320 * MiB, VolumeParameters())
    vid = f"nvmeof-v1.loop.{vol.ref.uuid}"
    staging, target = str(tmp / "staging"), str(tmp / "pod" / "mnt")
    access = AccessSpec(block=False, fs_type=fs)
    svc.stage(vid, vol.ref, staging, access, vol.context, 60)
    svc.publish(vol.ref, staging, target, access, False)
    payload = os.urandom(3 * MiB)
    Path(target, "data.bin").write_bytes(payload)
    svc.unpublish(vol.ref, target)
    svc.unstage(vol.ref, staging)
    assert LoopConnector(SubprocessExecutor()).find_device(vol.ref, vol.context) is None
    svc.stage(vid, vol.ref, staging, access, vol.context, 60)  # must not reformat
    svc.publish(vol.ref, staging, target, access, True)
    assert Path(target, "data.bin").read_bytes() == payload
    with pytest.raises(OSError):
        Path(target, "new").write_text("readonly")
    if fs == "ext4" and not _has_cap_sys_resource():
        svc.unpublish(vol.ref, target)
        svc.unstage(vol.ref, staging)
        pytest.skip("ext4 online resize needs CAP_SYS_RESOURCE, which this sandbox drops (the lab VM has it)")
    before = usage(staging).total_bytes
    backend.expand_volume(vol.ref, 640 * MiB)
    assert svc.expand(vol.ref, staging) == 640 * MiB
    assert usage(staging).total_bytes > before + 200 * MiB
    svc.unpublish(vol.ref, target)
    svc.unstage(vol.ref, staging)


@pytest.mark.root
def test_block_volume_bytes_round_trip(parts) -> None:  # type: ignore[no-untyped-def]
    backend, svc, tmp = parts
    vol = backend.create_volume("blk", 64 * MiB, VolumeParameters())
    vid = f"nvmeof-v1.loop.{vol.ref.uuid}"
    staging, target = str(tmp / "staging"), str(tmp / "pod" / "dev")
    svc.stage(vid, vol.ref, staging, AccessSpec(block=True), vol.context, 60)
    svc.publish(vol.ref, staging, target, AccessSpec(block=True), False)
    payload = os.urandom(MiB)
    with open(target, "r+b") as dev:
        dev.seek(5 * MiB)
        dev.write(payload)
        dev.flush()
        os.fsync(dev.fileno())
    svc.unpublish(vol.ref, target)
    svc.unstage(vol.ref, staging)
    with open(vol.context["loop.path"], "rb") as image:
        image.seek(5 * MiB)
        assert image.read(MiB) == payload
