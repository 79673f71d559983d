"""The benchmark across machines (``bench/across.py``) in its smoke mode on the tier's cluster: every code path
once (planned failover and path loss over TCP, path loss over RDMA, on one machine and between machines), 0 I/O errors, every
fault seen by its initiator, the numbers in ``results/bench-across.json`` for the bench tier's report. The full
measurement is ``./dev bench``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench import across
from lab.cluster import LabCluster

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]


def test_the_benchmark_across_machines_runs_side_by_side_with_one_machine(
    cluster: LabCluster, report: Reporter
) -> None:
    doc = across.run(cluster, across.parser().parse_args(["--smoke"]))
    places = {(r["place"], r["transport"], r["fault"]) for r in doc["runs"]}
    assert len(places) == 4, places  # smoke: one planned failover; RDMA path loss on one machine cannot be made
    for line in across.section(doc)[2:]:
        report("bench across (smoke)", line)
    assert doc["errors"] == 0 and doc["unseen"] == 0
