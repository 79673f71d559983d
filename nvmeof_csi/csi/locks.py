"""The CSI services' lock table: which request fields each RPC locks for its whole duration.

The shared edge (``nvmeof_csi.rpc.edge``) takes these keys with :class:`nvmeof_csi.rpc.locks.KeyedLocks`
before the servicer runs, so two RPCs on one volume never run at once (the second gets ABORTED).
"""

from __future__ import annotations

_C = "/csi.v1.Controller/"
_N = "/csi.v1.Node/"

#: RPC full method name -> request fields whose values are locked for the call's duration.
CSI_LOCK_TABLE: dict[str, tuple[str, ...]] = {
    _C + "CreateVolume": ("name",),
    _C + "DeleteVolume": ("volume_id",),
    _C + "ControllerPublishVolume": ("volume_id",),
    _C + "ControllerUnpublishVolume": ("volume_id",),
    _C + "ControllerExpandVolume": ("volume_id",),
    _C + "ControllerModifyVolume": ("volume_id",),
    _C + "CreateSnapshot": ("name",),
    _C + "DeleteSnapshot": ("snapshot_id",),
    _N + "NodeStageVolume": ("volume_id",),
    _N + "NodeUnstageVolume": ("volume_id",),
    _N + "NodePublishVolume": ("volume_id",),
    _N + "NodeUnpublishVolume": ("volume_id",),
    _N + "NodeExpandVolume": ("volume_id",),
}
