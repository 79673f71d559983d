"""The cluster tier: three lab VMs (``storage-1``, ``gpu-1``, ``gpu-2``) on links that share nothing, booted once
for the session (``lab/cluster.py``). Under CI=true a cluster that cannot start fails the run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import BuildError, BuildInfo, Fabric, LabError, lab_qemu_pids
from lab.cluster import NODES, LabCluster, address
from tests.support.env import in_ci, need
from tests.support.lab import report
from tests.support.pki import make_pki

__all__ = ["cluster", "cluster_pki", "pytest_sessionfinish", "report"]


@pytest.fixture(scope="session")
def cluster_pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The agent's and the drivers' certificates, made before the machines boot: a guest's clock may trail the
    host's by a second or two, and a certificate made the moment before its first use would not be valid yet."""
    return make_pki(tmp_path_factory.mktemp("pki"), "cl", ("ctrl",), server_ips=(address(NODES[0], "mgmt"),))


@pytest.fixture(scope="session")
def cluster(cluster_pki: dict[str, Path]) -> Iterator[LabCluster]:
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
