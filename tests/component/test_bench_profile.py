"""bench/profile.py against the real py-spy: a busy Python process is sampled and its stacks categorised."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.profile import OTHER, categorise, record

BUSY = "import time\nwhile True:\n    sum(i * i for i in range(10000))\n"


def test_py_spy_samples_a_running_process(tmp_path: Path) -> None:
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        raw, steps = record(busy.pid, 2, tmp_path / "raw.txt", lambda: time.sleep(0.05), rate=100)
    finally:
        busy.kill()
        busy.wait()
    shares, _, samples = categorise(raw)
    assert samples >= 50  # 2 s at 100 Hz of a process that never idles
    assert shares[OTHER] == 1.0  # nothing of ours ran in it
    assert steps >= 10  # the step ran the whole time py-spy sampled


def test_a_process_that_is_gone_is_refused_with_py_spys_words(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        record(gone.pid, 1, tmp_path / "raw.txt", lambda: time.sleep(0.05))
    except RuntimeError as exc:
        assert f"process {gone.pid}" in str(exc)
    else:
        raise AssertionError("sampling a process that is gone did not fail")
