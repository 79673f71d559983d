"""The handle of a running Alluxio cluster over a generated data set (``lab/dataset_files.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.alluxio import AlluxioCluster, AlluxioError
from lab.dataset_files import Dataset
from nvmeof_csi.datasets.client import AlluxioRest


@dataclass
class Alluxio:
    cluster: AlluxioCluster
    rest: AlluxioRest
    ufs: Path
    dataset: Dataset


def start_alluxio(base: Path, ufs: Path, ports: dict[str, int] | None = None) -> AlluxioCluster:
    """A started Alluxio cluster in ``base`` over ``ufs`` (on ``ports`` when given); the test fails with the
    servers' log tails when it cannot start (nothing is left running)."""
    cluster = AlluxioCluster(base, ufs, ports=dict(ports or {}))
    try:
        return cluster.start()
    except AlluxioError as err:
        cluster.stop()
        pytest.fail(f"Alluxio did not start: {err}")
