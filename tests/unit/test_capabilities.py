import pytest

from nvmeof_csi.csi import capabilities
from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.gen import csi_pb2

Mode = csi_pb2.VolumeCapability.AccessMode


def cap(mode: int, block: bool = False, fs: str = "", flags: tuple[str, ...] = ()) -> csi_pb2.VolumeCapability:
    c = csi_pb2.VolumeCapability(access_mode=Mode(mode=mode))  # type: ignore[arg-type]
    if block:
        c.block.SetInParent()
    else:
        c.mount.fs_type = fs
        c.mount.mount_flags.extend(flags)
    return c


def test_mount_spec() -> None:
    spec = capabilities.access_spec(cap(Mode.SINGLE_NODE_WRITER, fs="xfs", flags=("noatime",)))
    assert not spec.block and spec.fs_type == "xfs" and spec.mount_flags == ("noatime",)


def test_block_allows_multi_writer() -> None:
    assert capabilities.access_spec(cap(Mode.MULTI_NODE_MULTI_WRITER, block=True)).block


@pytest.mark.parametrize(
    ("c", "needle"),
    [
        (cap(Mode.MULTI_NODE_MULTI_WRITER), "MULTI_NODE_MULTI_WRITER"),
        (cap(Mode.SINGLE_NODE_WRITER, fs="ntfs"), "ntfs"),
        (cap(Mode.UNKNOWN), "access_mode"),
        (csi_pb2.VolumeCapability(access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER)), "access_type"),
    ],
)
def test_rejected(c: csi_pb2.VolumeCapability, needle: str) -> None:
    assert needle in (capabilities.unsupported_reason(c) or "")
    with pytest.raises(InvalidArgument, match=needle):
        capabilities.access_spec(c)


def test_empty_list_rejected() -> None:
    with pytest.raises(InvalidArgument, match="volume_capabilities"):
        capabilities.check_all([])


def test_readonly_modes() -> None:
    assert capabilities.is_readonly_mode(cap(Mode.MULTI_NODE_READER_ONLY))
    assert not capabilities.is_readonly_mode(cap(Mode.SINGLE_NODE_WRITER))
