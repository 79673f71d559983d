"""Our Alluxio client against the real Alluxio: the namespace, pins, TTLs and frees, load jobs that warm the cache,\nand an unreachable Alluxio reported as UNAVAILABLE."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lab.dataset_files import make_dataset
from lab.fabric import wait_until
from nvmeof_csi.datasets.client import AlluxioRest, CacheNotFound, CacheUnavailable, JobServiceLoader
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from tests.support.datasets import Alluxio

MiB = 1 << 20
FABRIC = FabricMap((AgentEntry("store-a", Endpoint.parse("unix:///a"), "f1", "z1", ("tcp",)),))


def test_client_namespace_pin_ttl_free_lifecycle(alluxio: Alluxio, tmp_path: Path) -> None:
    rest = alluxio.rest
    small = make_dataset(tmp_path / "small", files=4, seed=3)
    rest.mount("/client-test", str(small.root))
    try:
        files = rest.files("/client-test")
        assert [f.path.removeprefix("/client-test/") for f in files] == sorted(small.checksums)
        first = files[0]
        assert (
            first.in_alluxio_percentage == 0
            and first.length == (small.root / sorted(small.checksums)[0]).stat().st_size
        )
        data = b"".join(rest.read(first.path))
        assert hashlib.sha256(data).hexdigest() == small.checksums[sorted(small.checksums)[0]]
        cached = rest.get_status(first.path)
        assert cached.in_alluxio_percentage == 100 and cached.locations and cached.locations[0].tier in ("MEM", "SSD")

        rest.set_attribute("/client-test", pinned=True)
        assert rest.get_status(first.path).pinned and rest.get_status("/client-test").pinned
        rest.set_attribute("/client-test", ttl_ms=3_600_000, ttl_action="FREE")
        status = rest.get_status("/client-test")
        assert (status.ttl_ms, status.ttl_action) == (3_600_000, "FREE")

        rest.set_attribute("/client-test", pinned=False)
        rest.free("/client-test")
        assert wait_until(lambda: rest.get_status(first.path).in_alluxio_percentage == 0, 30)

        # TTL with action FREE: the cached copy goes, the file stays
        b"".join(rest.read(files[1].path))
        assert rest.get_status(files[1].path).in_alluxio_percentage == 100
        rest.set_attribute(files[1].path, ttl_ms=1000, ttl_action="FREE", recursive=False)
        assert wait_until(lambda: rest.get_status(files[1].path).in_alluxio_percentage == 0, 60)
        assert rest.exists(files[1].path)

        with pytest.raises(CacheNotFound):
            rest.get_status("/client-test/no-such-file")
    finally:
        rest.unmount("/client-test")
    assert not rest.exists("/client-test")


def test_load_job_warms_the_cache(alluxio: Alluxio, tmp_path: Path) -> None:
    rest, loader = alluxio.rest, JobServiceLoader(alluxio.rest)
    small = make_dataset(tmp_path / "load", files=3, seed=5)
    rest.mount("/load-test", str(small.root))
    try:
        paths = [f.path for f in rest.files("/load-test")]
        job = loader.load(paths)
        assert wait_until(lambda: loader.job_status(job).finished, 120)
        assert loader.job_status(job).status == "COMPLETED", loader.job_status(job)
        assert all(rest.get_status(p).in_alluxio_percentage == 100 for p in paths)
    finally:
        rest.free("/load-test")
        rest.unmount("/load-test")


def test_unreachable_alluxio_is_unavailable_after_retries() -> None:
    rest = AlluxioRest("http://127.0.0.1:9", "http://127.0.0.1:9", timeout=2, attempts=2)
    with pytest.raises(CacheUnavailable, match="unreachable"):
        rest.exists("/x")


# -- dataset volumes ---------------------------------------------------------------------------------------
