"""Where every benchmark leaves its numbers (``results/bench-<name>.json`` in the repository), and the lab VM
the benchmarks run in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab import Fabric, LabVM
from lab.build import REPO


@contextmanager
def in_one_vm() -> Iterator[LabVM]:
    """A booted lab VM with the NVMe-oF modules loaded, stopped and removed afterwards (a benchmark run alone;
    ``bench.suite`` runs several in one)."""
    with LabVM() as vm:
        Fabric(vm).load()
        yield vm


def save(name: str, result: dict[str, Any]) -> Path:
    folder = REPO / "results"
    folder.mkdir(exist_ok=True)
    path = folder / f"bench-{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def growth(samples: list[list[int]], warmup: float = 0.2) -> dict[str, float]:
    """Growth of a process after warm-up from ``[[cycles, rss_kib, fds], ...]``: the RSS change in percent and
    the change in open file descriptors between the first sample at or past ``warmup`` of the cycles and the
    last sample (``rss_growth_pct``, ``fd_growth``)."""
    last = samples[-1]
    start = next(s for s in samples if s[0] >= warmup * last[0])
    return {
        "rss_growth_pct": round((last[1] - start[1]) / start[1] * 100, 2) if start[1] else 0.0,
        "fd_growth": last[2] - start[2],
    }
