"""bench/qos.py: fio's per-second IOPS log read as fio writes it (fio 3.33 with --log_avg_msec=1000)."""

from __future__ import annotations

import statistics

from bench.qos import fio_argv, limit_at, per_second


def test_the_per_second_log_gives_one_value_per_second_and_a_stall_does_not_move_the_median() -> None:
    log = "999, 500, 0, 0, 0\n1999, 498, 0, 0, 0\n2999, 61, 0, 0, 0\n3999, 502, 0, 0, 0\n\n"
    values = per_second(log)
    assert values == [500.0, 498.0, 61.0, 502.0]
    assert statistics.median(values) == 499.0 and statistics.mean(values) < 400


def test_the_log_is_asked_for_only_when_named() -> None:
    assert not any(a.startswith("--write_iops_log") for a in fio_argv("/dev/x", "randread", 6))
    logged = fio_argv("/dev/x", "randread", 6, "/tmp/q")
    assert "--write_iops_log=/tmp/q" in logged and "--log_avg_msec=1000" in logged


def test_limits_are_multiples_of_the_kernels_step_and_never_zero() -> None:
    assert limit_at(565.0, 0.15) == 80 and limit_at(779.9, 0.45) == 350
    assert limit_at(1660.0, 0.3) == 490 and limit_at(30.0, 0.15) == 10
