"""Shared test helpers: where results go, and "skip locally, fail in CI" for missing prerequisites."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def need(condition: bool, why: str) -> None:
    """Skip when ``condition`` is false, except under CI=true, where a missing prerequisite fails the run."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"prerequisite missing in CI: {why}")
    pytest.skip(why)


def root_with_loop() -> None:
    need(os.geteuid() == 0, "needs root (loop devices, mount)")
    need(Path("/dev/loop-control").exists(), "needs /dev/loop-control")
    need(
        all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "mkfs.xfs", "blkid")),
        "needs util-linux, e2fsprogs, xfsprogs",
    )
