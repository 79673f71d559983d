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
- Thread-safe: fills of different volumes run concurrently; the agent never fills one volume twice at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from nvmeof_csi.nvmeof.dataset import DatasetSpec


class Filler(Protocol):
    def fill(self, vol_uuid: str, spec: DatasetSpec, backing: Path, capacity: int) -> dict[str, str]: ...

    def progress(self, vol_uuid: str) -> str: ...

    def discard(self, vol_uuid: str) -> None: ...

    def release(self, spec: DatasetSpec, others: Iterable[DatasetSpec]) -> None: ...
