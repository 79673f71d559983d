"""Volume capabilities: validation as the CSI spec requires, and translation to :class:`AccessSpec`.

Contract: :func:`access_spec` raises ``InvalidArgument`` naming the problem for a capability that is
missing parts or that this driver cannot serve; :func:`unsupported_reason` returns the reason instead of
raising (for ValidateVolumeCapabilities, which answers "not confirmed" rather than failing).
"""

from __future__ import annotations

from collections.abc import Iterable

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.gen import csi_pb2
from nvmeof_csi.service.records import MIN_FS_BYTES, SUPPORTED_FS, AccessSpec

Mode = csi_pb2.VolumeCapability.AccessMode

#: Access modes for filesystem volumes; block volumes additionally allow multi-node writers.
FS_MODES = frozenset(
    {
        Mode.SINGLE_NODE_WRITER,
        Mode.SINGLE_NODE_READER_ONLY,
        Mode.SINGLE_NODE_SINGLE_WRITER,
        Mode.SINGLE_NODE_MULTI_WRITER,
        Mode.MULTI_NODE_READER_ONLY,
    }
)
BLOCK_MODES = FS_MODES | {Mode.MULTI_NODE_MULTI_WRITER, Mode.MULTI_NODE_SINGLE_WRITER}
READONLY_MODES = frozenset({Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY})
ONE_NODE_MODES = frozenset(
    {
        Mode.SINGLE_NODE_WRITER,
        Mode.SINGLE_NODE_READER_ONLY,
        Mode.SINGLE_NODE_SINGLE_WRITER,
        Mode.SINGLE_NODE_MULTI_WRITER,
    }
)


def unsupported_reason(cap: csi_pb2.VolumeCapability) -> str | None:
    """Why ``cap`` cannot be served, or ``None`` when it can."""
    kind = cap.WhichOneof("access_type")
    if kind is None:
        return "volume capability has no access_type (mount or block)"
    if not cap.HasField("access_mode") or cap.access_mode.mode == Mode.UNKNOWN:
        return "volume capability has no access_mode"
    mode = cap.access_mode.mode
    name = csi_pb2.VolumeCapability.AccessMode.Mode.Name(mode)
    if kind == "block":
        return None if mode in BLOCK_MODES else f"access mode {name} is not supported for block volumes"
    if mode not in FS_MODES:
        return f"access mode {name} is not supported with a filesystem (mount) volume; use block"
    fs_type = cap.mount.fs_type
    if fs_type and fs_type not in SUPPORTED_FS:
        return f"fsType {fs_type!r} is not supported (use one of {', '.join(SUPPORTED_FS)})"
    return None


def access_spec(cap: csi_pb2.VolumeCapability) -> AccessSpec:
    """Validated translation of one capability."""
    reason = unsupported_reason(cap)
    if reason:
        raise InvalidArgument(reason)
    readonly = is_readonly_mode(cap)
    single = cap.access_mode.mode == csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_SINGLE_WRITER
    if cap.WhichOneof("access_type") == "block":
        return AccessSpec(block=True, readonly=readonly, single_target=single)
    return AccessSpec(
        block=False,
        fs_type=cap.mount.fs_type,
        mount_flags=tuple(cap.mount.mount_flags),
        readonly=readonly,
        single_target=single,
    )


def check_all(caps: Iterable[csi_pb2.VolumeCapability]) -> list[AccessSpec]:
    specs = [access_spec(c) for c in caps]
    if not specs:
        raise InvalidArgument("volume_capabilities must not be empty")
    return specs


def filesystem_floor(specs: Iterable[AccessSpec]) -> tuple[int, str]:
    """The smallest volume every requested filesystem can be made on, and the filesystem that sets it."""
    floors = [(MIN_FS_BYTES.get(s.fs_type, 0), s.fs_type) for s in specs if not s.block and s.fs_type]
    return max(floors, default=(0, ""))


def is_one_node_mode(cap: csi_pb2.VolumeCapability) -> bool:
    """An access mode that lets one node at a time use the volume."""
    return cap.access_mode.mode in ONE_NODE_MODES


def is_readonly_mode(cap: csi_pb2.VolumeCapability) -> bool:
    return cap.access_mode.mode in READONLY_MODES
