"""The cluster tier: four lab VMs (``storage-1``, its replication peer ``storage-2``, ``gpu-1``, ``gpu-2``) on links
that share nothing, booted once for the session (``lab/cluster.py``). Under CI=true a cluster that cannot start fails the run; after the session no
lab QEMU may remain (``tests.support.lab``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import Fabric
from lab.cluster import NODES, WITH_PEER, LabCluster, address
from lab.cluster_driver import ClusterDriver, running_cluster_driver
from tests.support.lab import pytest_sessionfinish, report, start_lab
from tests.support.pki import make_pki

__all__ = ["cluster", "cluster_pki", "pytest_sessionfinish", "report", "stack"]


@pytest.fixture(scope="session")
def cluster_pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The agent's and the drivers' certificates, made before the machines boot: a guest's clock may trail the
    host's by a second or two, and a certificate made the moment before its first use would not be valid yet."""
    return make_pki(tmp_path_factory.mktemp("pki"), "cl", ("ctrl",), server_ips=(address(NODES[0], "mgmt"),))


@pytest.fixture(scope="session")
def cluster(cluster_pki: dict[str, Path]) -> Iterator[LabCluster]:
    lab = start_lab(lambda: LabCluster(WITH_PEER).start(), "lab cluster")
    try:
        for vm in lab.vms.values():
            Fabric(vm).load(rdma=True)
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="package")
def stack(cluster: LabCluster, cluster_pki: dict[str, Path]) -> Iterator[ClusterDriver]:
    """The driver across the cluster (``lab/cluster_driver.py``), started once for every test that drives it.
    ``LAB_FENCE_ON`` (e.g. ``none``) passes ``--fence-on`` to the drivers: the fencing proofs then show what
    lands without fencing."""
    fence_on = os.environ.get("LAB_FENCE_ON", "")
    extra = ["--fence-on", fence_on] if fence_on else []
    with running_cluster_driver(cluster, cluster_pki, identity="cl-ctrl", driver_args=extra) as driver:
        yield driver
