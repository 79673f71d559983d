"""bench/scale_node_parts.py: a cycle's parts add up to its total, a nested part is not counted twice, and the
growth from the fewest volumes to the most is told apart into the kernel's part and the node's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scale_node_parts import NAMES, OWN, TABLE, Parts, TimedExecutor, growth, medians, timed_table
from nvmeof_csi.host.executor import Result


class Echo:
    def run(
        self, argv: object, *, timeout: float, check: bool = True, stdin: object = None, secrets: object = ()
    ) -> Result:
        return Result(0, "", "")


def test_a_cycle_logs_each_program_and_table_read_and_own_is_the_rest(tmp_path: Path) -> None:
    parts = Parts()
    ex = TimedExecutor(Echo(), parts)
    table = timed_table(parts, str(tmp_path / "mountinfo"))
    table.write_text("line\n")

    def work() -> None:
        ex.run(["/usr/bin/umount", "/x"], timeout=1)
        ex.run(["umount", "/y"], timeout=1)
        assert table.read_text() == "line\n"

    got = parts.cycle(work)
    assert set(got) == {"total", "umount", TABLE, OWN}
    assert got["umount"] + got[TABLE] + got[OWN] == pytest.approx(got["total"])
    assert parts.log == []  # a cycle's entries are taken out of the log


def test_a_nested_part_counts_its_own_time_only() -> None:
    now = [0.0]  # seconds: a program takes 5 ms, the scan around it 2 ms more
    parts = Parts(clock=lambda: now[0])

    class Slow:
        def run(self, argv: object, **kw: object) -> Result:
            now[0] += 0.005
            return Result(0, "", "")

    ex = TimedExecutor(Slow(), parts)

    def scan() -> int:
        ex.run(["losetup", "-a"], timeout=1)
        now[0] += 0.002
        return 7

    got = parts.cycle(lambda: parts.part(NAMES, scan))
    assert got == pytest.approx({"total": 7.0, "losetup": 5.0, NAMES: 2.0, OWN: 0.0})
    assert parts.part(NAMES, scan) == 7


def test_a_failing_program_is_still_logged() -> None:
    class Fails:
        def run(self, argv: object, **kw: object) -> Result:
            raise OSError("gone")

    parts = Parts()
    with pytest.raises(OSError):
        TimedExecutor(Fails(), parts).run(["mount", "a", "b"], timeout=1)
    assert [name for name, _ in parts.log] == ["mount"]


def test_medians_count_a_missing_part_as_zero() -> None:
    got = medians([{"total": 4.0, "umount": 2.0}, {"total": 6.0}, {"total": 5.0, "umount": 1.0}])
    assert got == {"total": 5.0, "umount": 1.0}


def test_growth_splits_the_kernels_part_from_the_nodes_own() -> None:
    base = {"total": 10.0, "umount": 3.0, TABLE: 1.0, NAMES: 0.5, OWN: 5.5}
    top = {"total": 14.0, "umount": 3.0, TABLE: 3.0, NAMES: 1.0, OWN: 7.0}
    got = growth(base, top)
    assert got["ratio"] == 1.4
    assert got["floor_ratio"] == 1.2  # only the table read grew among the programs and table reads: +2 of 10
    assert got["own_ratio"] == round((7.0 + 1.0) / (5.5 + 0.5), 2)  # the node's code: own Python and names scan
    assert got["ms_added"] == {"total": 4.0, "umount": 0.0, TABLE: 2.0, NAMES: 0.5, OWN: 1.5}
