"""The cluster tier: three lab VMs (``storage-1``, ``gpu-1``, ``gpu-2``) on links that share nothing, booted once
for the session (``lab/cluster.py``). Under CI=true a cluster that cannot start fails the run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lab import BuildError, BuildInfo, Fabric, LabError, lab_qemu_pids
from lab.cluster import LabCluster
from tests.support.env import in_ci, need
from tests.support.lab import report

__all__ = ["cluster", "pytest_sessionfinish", "report"]


@pytest.fixture(scope="session")
def cluster() -> Iterator[LabCluster]:
    try:
        BuildInfo.load()
    except BuildError as err:
        need(False, str(err))
    try:
        lab = LabCluster().start()
    except LabError as err:
        if in_ci():
            pytest.fail(f"lab cluster did not start: {err}")
        pytest.skip(f"lab cluster did not start: {err}")
    try:
        for vm in lab.vms.values():
            Fabric(vm).load(rdma=True)
        yield lab
    finally:
        lab.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = lab_qemu_pids(parent=os.getpid())
    if left:
        print(f"\nlab: QEMU processes outlived the test run: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
