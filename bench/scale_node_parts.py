"""Where the node's time goes in one NodeStage + NodePublish or NodeUnpublish + NodeUnstage, split by part: each
program the node runs (``mount``, ``umount``, ``losetup``, ``mkfs.ext4``...; their own cost includes their own
reads of the kernel's tables), each read of the kernel's mount table, the loop stand-in's device scan, the
staging records' durable writes and their names scan, and the rest: the node plugin's own Python (checks,
mount points, cgroups). Used by ``bench/scale_node.py`` to say which part grows with the volumes published.

A :class:`Parts` log is shared by a :class:`TimedExecutor` (wraps the node's executor), a :class:`TimedTable`
(the mount table path handed to the node's ``Mounter``), a :class:`TimedLoopConnector` and a
:class:`TimedStore`; :meth:`Parts.cycle` times one block of calls and returns its milliseconds by part, ``own``
being what no logged part took.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PosixPath
from typing import Any, TypeVar

from nvmeof_csi.host.executor import Executor, Result
from nvmeof_csi.loop.connector import LoopConnector
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.service.records import StagingRecord, StagingStore

TABLE = "mount table read"
SCAN = "loop stand-in scan"
NAMES = "record names scan"
WRITES = "record writes"
OWN = "own"
T = TypeVar("T")


class Parts:
    """An append-only log of (part, milliseconds) while a cycle is timed; ``clock`` in seconds (injectable)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.log: list[tuple[str, float]] = []
        self.clock = clock

    def cycle(self, call: Callable[[], Any]) -> dict[str, float]:
        """Run ``call``; its total milliseconds as ``total``, each part's sum, and ``own`` = total minus parts."""
        mark = len(self.log)
        began = self.clock()
        call()
        total = (self.clock() - began) * 1000
        spent: dict[str, float] = {}
        for part, ms in self.log[mark:]:
            spent[part] = spent.get(part, 0.0) + ms
        del self.log[mark:]
        return {"total": total, **spent, OWN: total - sum(spent.values())}

    def part(self, name: str, call: Callable[[], T]) -> T:
        """Run ``call`` and log its milliseconds as ``name``, less any part logged while it ran (a program it
        ran stays that program's)."""
        mark = len(self.log)
        began = self.clock()
        try:
            return call()
        finally:
            inner = sum(ms for _, ms in self.log[mark:])
            self.log.append((name, (self.clock() - began) * 1000 - inner))


class TimedExecutor:
    """An :class:`Executor` that logs each program's milliseconds under its name into ``parts``."""

    def __init__(self, inner: Executor, parts: Parts) -> None:
        self._inner = inner
        self._parts = parts

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        check: bool = True,
        stdin: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Result:
        began = self._parts.clock()
        try:
            return self._inner.run(argv, timeout=timeout, check=check, stdin=stdin, secrets=secrets)
        finally:
            self._parts.log.append((os.path.basename(argv[0]), (self._parts.clock() - began) * 1000))


class TimedTable(PosixPath):
    """The mount table's path; each ``read_text`` is logged as one :data:`TABLE` read into ``into`` when set."""

    into: Parts | None = None

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        began = time.perf_counter() if self.into is None else self.into.clock()
        try:
            return super().read_text(encoding, errors)
        finally:
            if self.into is not None:
                self.into.log.append((TABLE, (self.into.clock() - began) * 1000))


class TimedLoopConnector(LoopConnector):
    """The loop stand-in whose device scan (a read of every loop device's backing file: it grows with the
    devices attached, and NVMe-oF has its own scan) is logged as :data:`SCAN`."""

    def __init__(self, executor: Executor, parts: Parts) -> None:
        super().__init__(executor)
        self._parts = parts

    def _devices_for(self, path: str) -> list[str]:
        return self._parts.part(SCAN, lambda: super(TimedLoopConnector, self)._devices_for(path))


class TimedStore(StagingStore):
    """Staging records whose durable writes and removals (fsync of file and folder) are logged as
    :data:`WRITES` and whose scan of the other records' names (an unstage's shared-connection check) as
    :data:`NAMES`."""

    def __init__(self, root: Path, parts: Parts) -> None:
        super().__init__(root)
        self._parts = parts

    def save(self, record: StagingRecord) -> None:
        self._parts.part(WRITES, lambda: super(TimedStore, self).save(record))

    def remove(self, ref: VolumeRef) -> None:
        self._parts.part(WRITES, lambda: super(TimedStore, self).remove(ref))

    def refs(self) -> frozenset[VolumeRef]:
        return self._parts.part(NAMES, super().refs)


def timed_table(parts: Parts, path: str = "/proc/self/mountinfo") -> TimedTable:
    table = TimedTable(path)
    table.into = parts
    return table


def medians(cycles: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per part, the median over cycles of its milliseconds (a part a cycle did not run counts 0 there)."""
    rows = list(cycles)
    names = sorted({name for row in rows for name in row})
    return {name: round(statistics.median(row.get(name, 0.0) for row in rows), 2) for name in names}


NODE_PARTS = (OWN, NAMES, WRITES)  # the node plugin's own code: its Python, its records' names scan and writes


def kernel_ms(parts: Mapping[str, float]) -> float:
    """The cycle's milliseconds in the programs it ran and its reads of the mount table."""
    return sum(ms for name, ms in parts.items() if name not in ("total", SCAN, *NODE_PARTS))


def node_ms(parts: Mapping[str, float]) -> float:
    """The cycle's milliseconds in the node plugin's own code (not a program, a table read or the stand-in)."""
    return sum(parts.get(name, 0.0) for name in NODE_PARTS)


def growth(base: Mapping[str, float], top: Mapping[str, float]) -> dict[str, Any]:
    """From the fewest volumes to the most: each part's growth in ms, the total's ratio, the ratio the total
    would reach if only the programs and table reads grew (``floor_ratio``: the kernel's and util-linux's part),
    and the ratio of the node plugin's own code (``own_ratio``: :data:`NODE_PARTS`)."""
    names = sorted(set(base) | set(top))
    return {
        "ms_added": {name: round(top.get(name, 0.0) - base.get(name, 0.0), 2) for name in names},
        "ratio": round(top["total"] / base["total"], 2),
        "floor_ratio": round((base["total"] + kernel_ms(top) - kernel_ms(base)) / base["total"], 2),
        "own_ratio": round(node_ms(top) / node_ms(base), 2) if node_ms(base) > 0 else None,
    }
