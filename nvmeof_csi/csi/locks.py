"""Keyed try-locks at the RPC edge, and the one table that says which request fields each RPC locks.

Contract: :meth:`KeyedLocks.hold` takes every key or none (sorted order, no waiting): a key held by another
RPC raises ``Aborted`` (gRPC ABORTED), which tells the CO to retry later. Entries are removed on release, so
the table never grows with the number of volumes seen. Thread-safe and usable from asyncio tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from nvmeof_csi.errors import Aborted

_C = "/csi.v1.Controller/"
_N = "/csi.v1.Node/"

#: RPC full method name -> request fields whose values are locked for the call's duration.
LOCK_TABLE: dict[str, tuple[str, ...]] = {
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


class KeyedLocks:
    """A set of held keys; ``hold`` fails fast instead of waiting."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held: set[str] = set()

    @contextmanager
    def hold(self, *keys: str) -> Iterator[None]:
        wanted = sorted({k for k in keys if k})
        with self._mutex:
            busy = [k for k in wanted if k in self._held]
            if busy:
                raise Aborted(f"an operation on {busy[0]!r} is already in progress")
            self._held.update(wanted)
        try:
            yield
        finally:
            with self._mutex:
                self._held.difference_update(wanted)

    def held(self) -> frozenset[str]:
        with self._mutex:
            return frozenset(self._held)
