"""The alluxio tier: one real Alluxio 2.9 cluster (master, worker with MEM + SSD tiers, job master, job worker,
REST proxy) on loopback for the whole session, over a local-folder under-store holding a generated data set of
about 1,000 files. A failing test prints the servers' log tails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.dataset_files import make_dataset
from nvmeof_csi.datasets.client import AlluxioRest
from tests.support.datasets import Alluxio, start_alluxio


@pytest.fixture(scope="session")
def alluxio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alluxio]:
    base = tmp_path_factory.mktemp("alluxio")
    ufs = base / "ufs"
    dataset = make_dataset(base / "datasets" / "train")  # outside the root UFS: mounted by dataset.uri
    cluster = start_alluxio(base / "cluster", ufs)
    try:
        yield Alluxio(cluster, AlluxioRest(cluster.proxy_url, cluster.job_url), ufs, dataset)
    finally:
        cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.failed and "alluxio" in getattr(item, "fixturenames", ()):
        cluster = item.funcargs.get("alluxio")  # type: ignore[attr-defined]
        if cluster is not None:
            report.sections.append(("Alluxio server logs", cluster.cluster.logs()))
