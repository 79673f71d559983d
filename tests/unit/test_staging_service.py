import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from nvmeof_csi.errors import AlreadyExists, CommandError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.service.records import AccessSpec, StagingStore
from nvmeof_csi.service.staging import StagingService
from tests.support.fakes import FakeConnector, FakeHost

MOUNT = AccessSpec(block=False, fs_type="ext4")
BLOCK = AccessSpec(block=True)


class Env:
    def __init__(self, tmp: Path) -> None:
        (tmp / "dev").mkdir()
        self.tmp = tmp
        self.host = FakeHost(tmp / "mountinfo")
        self.conn = FakeConnector(tmp / "dev")
        self.store_root = tmp / "records"
        self.store = StagingStore(self.store_root)
        self.svc = StagingService(
            self.conn,
            Mounter(self.host, tmp / "mountinfo"),
            Filesystems(self.host),
            self.store,
            size_of=lambda d: 7,
            root=tmp,
        )
        self.ref = VolumeRef("fake", str(uuid.uuid4()))
        self.vid = f"nvmeof-v1.fake.{self.ref.uuid}"
        self.mounter = Mounter(self.host, tmp / "mountinfo")

    def stage(self, access: AccessSpec = MOUNT, path: str = "") -> str:
        path = path or str(self.tmp / "staging")
        self.svc.stage(self.vid, self.ref, path, access, {"k": "v"}, 30)
        return path


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_stage_formats_blank_device_once_and_is_idempotent(env: Env) -> None:
    path = env.stage()
    env.stage()
    mkfs = [a for a in env.host.argvs if a[0].startswith("mkfs")]
    assert len(mkfs) == 1
    assert env.mounter.mount_at(path) is not None
    rec = env.store.load(env.ref)
    assert rec is not None and rec.device.endswith(env.ref.uuid[:8]) and rec.context == {"k": "v"}


def test_stage_never_reformats_a_different_filesystem(env: Env) -> None:
    dev = str(env.tmp / "dev" / f"dev-{env.ref.uuid[:8]}")
    env.host.signatures[dev] = "xfs"
    with pytest.raises(FailedPrecondition, match="refusing to reformat"):
        env.stage()
    assert not any(a[0].startswith("mkfs") for a in env.host.argvs)
    assert env.store.load(env.ref) is None  # rolled back
    assert ("disconnect", env.ref.uuid) in env.conn.calls


def test_failed_mount_rolls_back_in_reverse(env: Env) -> None:
    env.host.fail["mount"] = CommandError(["mount"], 32, "", "wrong fs type")
    with pytest.raises(CommandError):
        env.stage()
    assert env.conn.calls == [("connect", env.ref.uuid), ("disconnect", env.ref.uuid)]
    assert env.store.load(env.ref) is None


def test_failed_connect_leaves_nothing(env: Env) -> None:
    env.conn.fail_connect = Unavailable("target unreachable")
    with pytest.raises(Unavailable):
        env.stage()
    assert env.store.load(env.ref) is None


def test_stage_elsewhere_is_already_exists(env: Env) -> None:
    env.stage()
    with pytest.raises(AlreadyExists, match="already staged"):
        env.stage(path=str(env.tmp / "other"))
    with pytest.raises(AlreadyExists):
        env.stage(access=BLOCK)


def test_publish_unpublish_mount(env: Env) -> None:
    staging = env.stage()
    target = str(env.tmp / "pods" / "t1")
    with pytest.raises(FailedPrecondition, match="not staged"):
        env.svc.publish(env.ref, str(env.tmp / "elsewhere"), target, MOUNT, False)
    env.svc.publish(env.ref, staging, target, MOUNT, True)
    env.svc.publish(env.ref, staging, target, MOUNT, True)  # idempotent
    with pytest.raises(AlreadyExists):
        env.svc.publish(env.ref, staging, target, MOUNT, False)
    info = env.mounter.mount_at(target)
    assert info is not None and info.source == staging
    assert ["mount", "-o", "remount,bind,ro", target] in env.host.argvs
    with pytest.raises(FailedPrecondition, match="still published"):
        env.svc.unstage(env.ref, staging)
    env.svc.unpublish(env.ref, target)
    env.svc.unpublish(env.ref, target)
    assert not Path(target).exists()
    env.svc.unstage(env.ref, staging)
    env.svc.unstage(env.ref, staging)
    assert env.store.load(env.ref) is None and env.mounter.mounts() == []


def test_block_publish_binds_device_onto_a_file(env: Env) -> None:
    staging = env.stage(BLOCK)
    target = str(env.tmp / "pods" / "blk")
    env.svc.publish(env.ref, staging, target, BLOCK, False)
    assert Path(target).is_file()
    info = env.mounter.mount_at(target)
    assert info is not None and info.source == env.conn.connected[env.ref.uuid]
    stats = env.svc.stats(env.ref, target)
    assert stats.block and stats.capacity_bytes == 7 and stats.usage is None
    env.svc.unpublish(env.ref, target)
    assert not Path(target).exists()


def test_stats_and_expand_need_the_right_path(env: Env) -> None:
    staging = env.stage()
    with pytest.raises(NotFound):
        env.svc.stats(env.ref, "/not/its/path")
    with pytest.raises(NotFound):
        env.svc.stats(VolumeRef("fake", str(uuid.uuid4())), staging)
    env.conn.sizes[env.ref.uuid] = 5 << 30
    assert env.svc.expand(env.ref, staging) == 5 << 30
    assert any(a[0] == "resize2fs" for a in env.host.argvs)


def test_unstage_keeps_connections_other_volumes_use(env: Env) -> None:
    env.stage()
    other = VolumeRef("fake", str(uuid.uuid4()))
    env.svc.stage("v2", other, str(env.tmp / "s2"), BLOCK, {}, 30)
    seen: list[frozenset[VolumeRef]] = []
    real = env.conn.disconnect

    def spy(ref: VolumeRef, context: Mapping[str, str], in_use: frozenset[VolumeRef]) -> None:
        seen.append(in_use)
        real(ref, {}, in_use)

    env.conn.disconnect = spy  # type: ignore[method-assign]
    env.svc.unstage(env.ref, str(env.tmp / "staging"))
    assert seen == [frozenset({other})]


def test_paths_outside_the_kubelet_root_or_the_record_are_never_touched(env: Env) -> None:
    """Before confinement, NodeUnpublishVolume unlinked whatever target path it was given (the node plugin runs
    as root) and NodeUnstageVolume unmounted whatever staging path it was given."""
    staging = env.stage()
    target = str(env.tmp / "pods" / "t1")
    env.svc.publish(env.ref, staging, target, MOUNT, False)
    precious = env.tmp / "precious"
    precious.write_text("keep")
    for bad in ("/etc/passwd", "relative/path", f"{env.tmp}/../escape", str(env.tmp)):
        with pytest.raises(InvalidArgument):
            env.svc.unpublish(env.ref, bad)
        with pytest.raises(InvalidArgument):
            env.svc.publish(env.ref, staging, bad, MOUNT, False)
    env.svc.unpublish(env.ref, str(precious))  # inside the root, but not a target of ours: left alone
    assert precious.read_text() == "keep"
    with pytest.raises(FailedPrecondition, match="staged at"):
        env.svc.unstage(env.ref, str(env.tmp / "other-staging"))
    assert env.mounter.mount_at(staging) is not None and env.mounter.mount_at(target) is not None
    env.svc.unpublish(env.ref, target)
    env.svc.unstage(env.ref, staging)
    assert env.mounter.mount_at(staging) is None


@pytest.mark.parametrize("garbage", ["{not json", '{"volume_id": "x"}', "[1, 2]", "\xff\xfe"])
def test_a_corrupt_staging_record_is_quarantined_not_fatal(env: Env, garbage: str) -> None:
    """Before, one unreadable record made start-up reconciliation raise (the node plugin did not start) and
    every unstage of that volume fail with INTERNAL."""
    staging = env.stage()
    record = next(env.store_root.glob("*.json"))
    record.write_bytes(garbage.encode("latin-1"))
    assert env.svc.reconcile(30) == []  # starts; the record is set aside
    assert not record.exists() and len(list(env.store_root.glob("*.json.corrupt-*"))) == 1
    env.svc.unstage(env.ref, staging)  # no longer fails


RO_MOUNT = AccessSpec(block=False, fs_type="ext4", readonly=True)


def test_a_read_only_volume_is_never_formatted(env: Env) -> None:
    """Before, a ReadOnlyMany volume was formatted when blank and mounted read-write on every node."""
    with pytest.raises(FailedPrecondition, match="never formatted"):
        env.stage(RO_MOUNT)
    assert not any(a[0].startswith("mkfs") for a in env.host.argvs)


@pytest.mark.parametrize(("fs", "no_replay"), [("ext4", "noload"), ("xfs", "norecovery")])
def test_a_read_only_volume_is_mounted_ro_without_journal_replay(env: Env, fs: str, no_replay: str) -> None:
    dev = str(env.tmp / "dev" / f"dev-{env.ref.uuid[:8]}")
    env.host.signatures[dev] = fs
    staging = env.stage(AccessSpec(block=False, fs_type=fs, mount_flags=("rw", "noatime"), readonly=True))
    mount = next(a for a in env.host.argvs if a[0] == "mount")
    assert mount[mount.index("-o") + 1] == f"noatime,ro,{no_replay}"
    target = str(env.tmp / "pods" / "t1")
    env.svc.publish(env.ref, staging, target, AccessSpec(block=False, fs_type=fs), False)  # asks for rw: gets ro
    assert ["mount", "-o", "remount,bind,ro", target] in env.host.argvs


def test_a_read_only_block_volume_is_a_read_only_device_until_unstaged(env: Env) -> None:
    staging = env.stage(AccessSpec(block=True, readonly=True))
    device = str(env.tmp / "dev" / f"dev-{env.ref.uuid[:8]}")
    assert env.host.readonly_devices == {device}
    env.svc.unstage(env.ref, staging)
    assert env.host.readonly_devices == set()
