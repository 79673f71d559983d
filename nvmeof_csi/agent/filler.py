"""The one seam between the agent and whatever fills a new volume with data before it is exported.

A volume whose parameters name a data set (``VolumeParameters.dataset``) is filled (today from Alluxio, by
``nvmeof_csi.datasets``); the agent core knows nothing about where the data comes from. It only calls a :class:`Filler`.

Contract of every :class:`Filler`:
- :meth:`Filler.fill` fills the volume's backing file and returns labels to record with the volume; calling it
  again after a crash resumes the work where it stopped (never restarts it from scratch, never doubles data).
  It raises ``nvmeof_csi.errors`` classes (``Unavailable`` when the source cannot be reached, ``OutOfRange``
  when the data does not fit, ``InvalidArgument`` for bad parameters).
- :meth:`Filler.progress` is a one-line text while :meth:`Filler.fill` runs for that volume, else ``""``.
- :meth:`Filler.discard` removes the volume's work files; absent is success.
- :meth:`Filler.release` lets go of the source data once no other volume (``others``: their data sets) uses
  it; it never raises for a source that cannot be reached (deleting a volume must not fail because of it).
- :meth:`Filler.slot` holds one of the filler's fill slots for a ``with`` block: at once, or ``SlotsBusy``
  (RESOURCE_EXHAUSTED) when none is free and ``wait`` is false (an RPC thread never waits for one); the agent
  takes it before it saves anything of a new volume to fill, and around every fill it runs.
- Thread-safe: fills of different volumes run concurrently; the agent never fills one volume twice at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from nvmeof_csi.nvmeof.dataset import DatasetSpec


class Filler(Protocol):
    def fill(self, vol_uuid: str, spec: DatasetSpec, backing: Path, capacity: int) -> dict[str, str]: ...

    def progress(self, vol_uuid: str) -> str: ...

    def discard(self, vol_uuid: str) -> None: ...

    def release(self, spec: DatasetSpec, others: Iterable[DatasetSpec]) -> None: ...

    def slot(self, wait: bool) -> AbstractContextManager[None]: ...
