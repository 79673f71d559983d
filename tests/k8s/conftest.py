"""The Kubernetes tier: one cluster (host control plane + the lab VM as the node, the driver installed with
``helm install`` from ``deploy/helm/nvmeof-csi`` and its ``ci/lab-values.yaml``) for the whole session. A failing test gets kubelet, containerd, sidecar, driver and
control-plane logs attached to its report. Under CI=true a cluster that cannot start fails the run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from lab import BuildError, BuildInfo
from lab.alluxio import PORT_KEYS, free_ports
from lab.kube.build import KubeBuildError, binary
from lab.kube.cluster import KubeCluster, helm_binary, running_cluster
from lab.kube.control_plane import KubeError
from lab.kube.layout import ALLUXIO_JOB, ALLUXIO_PROXY
from tests.support.env import need
from tests.support.lab import pytest_sessionfinish, report

__all__ = ["kube", "pytest_sessionfinish", "report"]

CLUSTER = pytest.StashKey[KubeCluster]()  # the session's cluster, for the failure hook (hooks get no fixtures)
ALLUXIO_PORTS = pytest.StashKey[dict[str, int]]()  # the host ports the VMs' Alluxio forwards lead to
PROXY_PORT, JOB_PORT = "alluxio.proxy.web.port", "alluxio.job.master.web.port"


def fence_on() -> list[str]:
    """``LAB_FENCE_ON`` (e.g. ``none``) sets the controller's ``--fence-on``: the node loss scenario then shows
    what happens without fencing (it fails: ``LAB_FENCE_ON=none pytest tests/k8s -m lab -k node_loss``)."""
    value = os.environ.get("LAB_FENCE_ON", "")
    return ["--set-json", f'controller.extraArgs=["--fence-on={value}"]'] if value else []


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    try:
        BuildInfo.load()
        binary("kubelet")
        helm_binary()
    except (BuildError, KubeBuildError, KubeError) as err:
        need(False, str(err))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with contextlib.ExitStack() as stack:
        # the Alluxio ports the VMs reach (the data set scenario starts Alluxio on them when it runs)
        ports = dict(zip(PORT_KEYS, free_ports(len(PORT_KEYS)), strict=True))
        forwards = {ALLUXIO_PROXY: ports[PROXY_PORT], ALLUXIO_JOB: ports[JOB_PORT]}
        with capture.global_and_fixture_disabled():  # the start-up steps print their durations
            cluster = stack.enter_context(running_cluster(forwards=forwards, helm_args=fence_on()))
        request.config.stash[ALLUXIO_PORTS] = ports
        request.config.stash[CLUSTER] = cluster
        try:
            yield cluster
        finally:
            del request.config.stash[CLUSTER]


#: The order the tier's modules run in, declared rather than alphabetical: each shares the one cluster, the
#: uninstall scenarios must come last, and a new module must be placed here (collection fails otherwise).
#: Within a module, tests run in the order they are written.
MODULE_ORDER = (
    "test_identity",
    "test_kubernetes",
    "test_node_loss",
    "test_steering",
    "test_tenant_pod",
    "test_training",
    "test_uninstall",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run this tier's tests module by module in :data:`MODULE_ORDER` (a stable sort: the order within a module
    stays as written); a module of this tier that the order does not name is a collection error."""
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.path))
        if path.parent != here:
            return -1  # another tier's test in the same run keeps its place
        if path.stem not in MODULE_ORDER:
            raise pytest.UsageError(f"tests/k8s/{path.name} is not in MODULE_ORDER (tests/k8s/conftest.py)")
        return MODULE_ORDER.index(path.stem)

    items.sort(key=rank)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    rep = yield
    cluster = item.config.stash.get(CLUSTER, None)
    if isinstance(rep, pytest.TestReport) and rep.failed and cluster is not None:
        try:
            rep.sections.append(("cluster logs", cluster.driver_logs()))
        except Exception as exc:  # a log collection failure must not hide the test's own failure
            rep.sections.append(("cluster logs", f"could not collect: {exc}"))
    return rep
