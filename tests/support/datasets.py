"""A generated data set in a local folder (the under-store), and the handle of a running Alluxio cluster."""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.alluxio import AlluxioCluster, AlluxioError
from nvmeof_csi.datasets.client import AlluxioRest

FILES = 1000
MIN_KIB, MAX_KIB = 64, 448  # about 250 MiB in all


@dataclass
class Dataset:
    root: Path  # the UFS folder
    checksums: dict[str, str]  # relative path -> sha256

    @property
    def bytes(self) -> int:
        return sum((self.root / rel).stat().st_size for rel in self.checksums)


@dataclass
class Alluxio:
    cluster: AlluxioCluster
    rest: AlluxioRest
    ufs: Path
    dataset: Dataset


def make_dataset(root: Path, files: int = FILES, seed: int = 7) -> Dataset:
    rnd = random.Random(seed)
    checksums = {}
    for i in range(files):
        rel = f"shard-{i // 100:02d}/sample-{i:05d}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(rnd.randint(MIN_KIB, MAX_KIB) << 10)
        path.write_bytes(data)
        checksums[rel] = hashlib.sha256(data).hexdigest()
    return Dataset(root, checksums)


def start_alluxio(base: Path, ufs: Path, ports: dict[str, int] | None = None) -> AlluxioCluster:
    """A started Alluxio cluster in ``base`` over ``ufs`` (on ``ports`` when given); the test fails with the
    servers' log tails when it cannot start (nothing is left running)."""
    cluster = AlluxioCluster(base, ufs, ports=dict(ports or {}))
    try:
        return cluster.start()
    except AlluxioError as err:
        cluster.stop()
        pytest.fail(f"Alluxio did not start: {err}")
