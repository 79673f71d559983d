"""bench/qos.py: fio's per-second IOPS log read as fio writes it (fio 3.33 with --log_avg_msec=1000)."""

from __future__ import annotations

import statistics

from bench.qos import fio_argv, per_second


def test_the_per_second_log_gives_one_value_per_second_and_a_stall_does_not_move_the_median() -> None:
    log = "999, 500, 0, 0, 0\n1999, 498, 0, 0, 0\n2999, 61, 0, 0, 0\n3999, 502, 0, 0, 0\n\n"
    values = per_second(log)
    assert values == [500.0, 498.0, 61.0, 502.0]
    assert statistics.median(values) == 499.0 and statistics.mean(values) < 400


def test_the_log_is_asked_for_only_when_named() -> None:
    assert not any(a.startswith("--write_iops_log") for a in fio_argv("/dev/x", "randread", 6))
    logged = fio_argv("/dev/x", "randread", 6, "/tmp/q")
    assert "--write_iops_log=/tmp/q" in logged and "--log_avg_msec=1000" in logged
