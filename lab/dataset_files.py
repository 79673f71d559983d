"""A generated data set in a local folder (an under-store for Alluxio): files of random sizes and contents,
each with its SHA-256, made the same for the same seed. Used by the Alluxio tier and by bench ``dataset``."""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

FILES = 1000
MIN_KIB, MAX_KIB = 64, 448  # about 250 MiB in all


@dataclass
class Dataset:
    root: Path  # the UFS folder
    checksums: dict[str, str]  # relative path -> sha256

    @property
    def bytes(self) -> int:
        return sum((self.root / rel).stat().st_size for rel in self.checksums)


def make_dataset(root: Path, files: int = FILES, seed: int = 7) -> Dataset:
    rnd = random.Random(seed)  # noqa: S311 - sizes of test data, not a secret
    checksums = {}
    for i in range(files):
        rel = f"shard-{i // 100:02d}/sample-{i:05d}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(rnd.randint(MIN_KIB, MAX_KIB) << 10)
        path.write_bytes(data)
        checksums[rel] = hashlib.sha256(data).hexdigest()
    return Dataset(root, checksums)
