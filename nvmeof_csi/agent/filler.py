"""The one seam between the agent and whatever fills a new volume with data before it is exported.

A volume whose parameters carry ``dataset.*`` keys is filled (today from Alluxio, by ``nvmeof_csi.datasets``);
the agent core knows nothing about where the data comes from. It only calls a :class:`Filler`.

Contract of every :class:`Filler`:
- :meth:`Filler.fill` fills the volume's backing file and returns labels to record with the volume; calling it
  again after a crash resumes the work where it stopped (never restarts it from scratch, never doubles data).
  It raises ``nvmeof_csi.errors`` classes (``Unavailable`` when the source cannot be reached, ``OutOfRange``
  when the data does not fit, ``InvalidArgument`` for bad parameters).
- :meth:`Filler.progress` is a one-line text while :meth:`Filler.fill` runs for that volume, else ``""``.
- :meth:`Filler.discard` removes the volume's work files; absent is success.
- :meth:`Filler.release` lets go of the source data once no other volume (``others``: their parameters) uses
  it; it never raises for a source that cannot be reached (deleting a volume must not fail because of it).
- Thread-safe: fills of different volumes run concurrently; the agent never fills one volume twice at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

FILL_PREFIX = "dataset."


def needs_fill(parameters: Mapping[str, str]) -> bool:
    """True for a volume that must be filled before it is exported."""
    return any(key.startswith(FILL_PREFIX) for key in parameters)


class Filler(Protocol):
    def fill(self, vol_uuid: str, parameters: Mapping[str, str], backing: Path, capacity: int) -> dict[str, str]: ...

    def progress(self, vol_uuid: str) -> str: ...

    def discard(self, vol_uuid: str) -> None: ...

    def release(self, parameters: Mapping[str, str], others: Iterable[Mapping[str, str]]) -> None: ...
