"""Where a process's time goes, by part of the agent: py-spy samples a running process for some seconds and each
sampled stack is put in one category (the first rule below that any frame of the stack matches), so a report
can say "of the 70 ms of agent CPU per create+delete, 9 ms are log lines, 12 ms state records, ...".

| category | a stack with a frame in |
|---|---|
| log lines | ``logging``, ``protobuf/text_format``, our redaction and log context (every log line) |
| state records | ``agent/state.py``, ``host/atomic.py`` (atomic, durable writes of the agent's records) |
| configfs | ``agent/configfs*.py`` (the nvmet objects) |
| pool image files | ``agent/pool.py`` (the volume's backing file) |
| authorization | ``agent/authz.py`` (the caller's role against the method) |
| agent logic | the rest of ``nvmeof_csi/agent`` (validation, locks, responses) |
| edge | the rest of ``nvmeof_csi/rpc`` (request ID, lock keys, metrics) |
| gRPC and threads | ``grpc/``, ``concurrent/futures``, ``threading`` (transport, (de)serialising, threads) |
| other | anything else |

``pathlib`` is reported across categories too (the share of samples with a ``pathlib`` frame anywhere). A
sample whose innermost frame is a thread waiting for work (``IDLE``) is not counted. A sample is a thread on
the CPU or in a system call (an fsync waiting for the disk counts): shares are of the agent's busy time, not of
its CPU time alone.

Contract: :func:`categorise` and :func:`leaves` are pure functions of py-spy's ``--format raw`` text (one
``frames count`` line per distinct stack; py-spy sometimes drops the outer frames of a stack, so every frame
present counts);
:func:`record` runs py-spy (next to the running interpreter) and raises ``RuntimeError`` with py-spy's own
words when it cannot sample.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("log lines", ("(logging/", "protobuf/text_format.py", "nvmeof_csi/rpc/redact.py", "nvmeof_csi/rpc/logctx.py")),
    ("state records", ("nvmeof_csi/agent/state.py", "nvmeof_csi/host/atomic.py")),
    ("configfs", ("nvmeof_csi/agent/configfs",)),
    ("pool image files", ("nvmeof_csi/agent/pool.py",)),
    ("authorization", ("nvmeof_csi/agent/authz.py",)),
    ("agent logic", ("nvmeof_csi/agent/",)),
    ("edge", ("nvmeof_csi/rpc/",)),
    ("gRPC and threads", ("(grpc/", "concurrent/futures/", "(threading.py")),
)
OTHER = "other"
PATHLIB = "(pathlib.py"
#: innermost frames of a thread waiting for work (a pool worker on its queue, a condition or event): not counted
IDLE = ("_worker (concurrent/futures/thread.py", "Condition.wait (threading.py", "Event.wait (threading.py")


def _category(stack: str) -> str:
    return next((name for name, marks in RULES if any(mark in stack for mark in marks)), OTHER)


def _busy(raw: str) -> Iterator[tuple[str, int]]:
    """(stack, samples) of each line of a raw py-spy text whose innermost frame is not a thread waiting for work
    (py-spy under TCG counts some blocked threads as active)."""
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit() and not stack.rsplit(";", 1)[-1].startswith(IDLE):
            yield stack, int(count)


def categorise(raw: str) -> tuple[dict[str, float], float, int]:
    """(share of samples per category, share of samples in pathlib, number of samples) of a raw py-spy text,
    threads waiting for work left out. Shares are fractions of the samples counted; every category of ``RULES``
    (and ``other``) is present."""
    counts = dict.fromkeys([name for name, _ in RULES] + [OTHER], 0)
    pathlib = total = 0
    for stack, n in _busy(raw):
        counts[_category(stack)] += n
        pathlib += n if PATHLIB in stack else 0
        total += n
    if not total:
        return {k: 0.0 for k in counts}, 0.0, 0
    return {k: round(v / total, 4) for k, v in counts.items()}, round(pathlib / total, 4), total


def leaves(raw: str, top: int = 15) -> list[tuple[str, float]]:
    """The ``top`` innermost frames (function and file, no line) by share of the samples counted, largest
    first."""
    counts: dict[str, int] = {}
    for stack, n in _busy(raw):
        leaf = stack.rsplit(";", 1)[-1].rsplit(":", 1)[0] + ")"
        counts[leaf] = counts.get(leaf, 0) + n
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    return [(name, round(n / total, 4)) for name, n in ranked]


def record(pid: int, seconds: int, out: Path, step: Callable[[], None], rate: int = 200) -> tuple[str, int]:
    """Sample process ``pid`` for ``seconds`` while calling ``step()`` (one unit of work that keeps the process
    busy) over and over until py-spy is done; returns (py-spy's raw text, the steps made meanwhile)."""
    spy = Path(sys.executable).with_name("py-spy")
    proc = subprocess.Popen(
        [
            str(spy),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--duration",
            str(seconds),
            "--format",
            "raw",
            "--threads",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    steps = 0
    try:
        while proc.poll() is None:
            step()
            steps += 1
    finally:
        _, err = proc.communicate(timeout=120)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy could not sample process {pid}: {err.strip()[-400:]}")
    return out.read_text(), steps
