"""What our controller's threads are doing while many claims are created (``bench/k8s_pvcs.py``): py-spy dumps
of every thread's stack, taken in the node VM that runs it (py-spy reaches the VM through the 9p share, next to
the interpreter the lab runs there), each thread counted by where it is: the innermost frame of our code and
the innermost frame of all. A thread waiting for work in a pool, a call waiting on an agent's answer, a call
waiting for a thread: the counts say which one holds the creates.

Contract: :func:`where` is a pure function of py-spy's ``dump`` text; :func:`dumps` takes ``count`` dumps
``every`` seconds apart and returns their texts (an empty text for a dump py-spy could not take).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from lab.guest_calls import Result

THREAD = re.compile(r'^Thread \S+ \((?P<state>\w+)\): "(?P<name>[^"]*)"')
FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>[^:)]+)")
POOL = re.compile(r"_\d+$")  # asyncio_3, rpc_12: a pool's threads share one name


class Guest(Protocol):
    """What :func:`dumps` needs of a lab VM (``lab.vm.LabVM``): an argv run in the guest."""

    def run(self, argv: Sequence[str], timeout: float = 60) -> Result: ...


def where(dump: str) -> dict[str, int]:
    """{"<thread name> | <innermost frame of ours> | <innermost frame>": threads} of one py-spy dump, a pool's
    threads under one name."""
    counts: dict[str, int] = {}
    threads: list[tuple[str, list[str]]] = []
    for line in dump.splitlines():
        if head := THREAD.match(line):
            threads.append((POOL.sub("_N", head["name"]), []))
        elif (frame := FRAME.match(line)) and threads:
            threads[-1][1].append(f"{frame['func']} ({frame['file'].rsplit('/site-packages/', 1)[-1]})")
    for name, frames in threads:
        ours = next((f for f in frames if "nvmeof_csi/" in f), "-")
        key = f"{name} | {ours} | {frames[0] if frames else '-'}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def dumps(vm: Guest, pattern: str, count: int = 3, every: float = 5.0) -> list[str]:
    """``count`` dumps of the oldest process whose command line matches ``pattern`` (a ``pgrep -f`` regular
    expression, passed as an argument, never through a shell) in ``vm``; "" for a dump that could not be taken."""
    spy = str(Path(sys.executable).with_name("py-spy"))
    out = []
    for i in range(count):
        if i:
            time.sleep(every)
        found = vm.run(["pgrep", "-o", "-f", "--", pattern], 30)
        pid = found.out.strip()
        res = vm.run([spy, "dump", "--nonblocking", "--pid", pid], 120) if found.rc == 0 and pid.isdigit() else None
        out.append(res.out if res is not None and res.rc == 0 else "")
    return out
