"""Dataset volumes against a real Alluxio 2.9: the REST/job client, pin/TTL/free lifecycle, cold then warm
hydration through the CSI controller and a real agent (plain configfs tree, real backing files, real ext4
built with mkfs.ext4 -d), checksums of every file, Alluxio's own metrics, and Alluxio killed mid-hydration."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from typer.testing import CliRunner

from lab.dataset_files import Dataset, make_dataset
from lab.fabric import wait_until
from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.pool import FileStore
from nvmeof_csi.agent.state import StateStore
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.agentclient.api import HostNqnNodes
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.cli.main import app as cli_app
from nvmeof_csi.csi.server import CsiServices, build_server
from nvmeof_csi.datasets.client import AlluxioRest, JobServiceLoader
from nvmeof_csi.datasets.fill import DatasetVolumes
from nvmeof_csi.datasets.holders import DatasetHolders
from nvmeof_csi.datasets.hydrate import DatasetMetrics, Hydrator
from nvmeof_csi.datasets.locality import CacheLocality, bytes_by_host
from nvmeof_csi.errors import DriverError
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.nvmeof.dataset import DatasetSpec
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import bind
from nvmeof_csi.service.provisioning import VolumeService
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from nvmeof_csi.topology.placement import Candidate, place
from tests.support.agents import PORTALS, LocalAgent, plain_configfs, start_agent
from tests.support.dashboard import DATASET_PANELS, has_data, panel_queries, render, scraped, slug
from tests.support.datasets import Alluxio
from tests.support.env import RESULTS
from tests.support.requests import mount_cap

MiB = 1 << 20
FABRIC = FabricMap((AgentEntry("store-a", Endpoint.parse("unix:///a"), "f1", "z1", ("tcp",)),))


@dataclass
class Stack:
    agent: TargetAgent
    registry: CollectorRegistry
    hydrator: Hydrator
    stub: csi_pb2_grpc.ControllerAsyncStub
    pool: Path

    async def create(self, name: str, params: dict[str, str], size: int = 512 * MiB) -> csi_pb2.Volume:
        reply = await self.stub.CreateVolume(
            csi_pb2.CreateVolumeRequest(
                name=name,
                capacity_range=csi_pb2.CapacityRange(required_bytes=size),
                volume_capabilities=[mount_cap()],
                parameters=params,
            ),
            timeout=1800,
        )
        return reply.volume

    async def delete(self, volume_id: str) -> None:
        await self.stub.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id), timeout=300)

    def backing(self, volume: csi_pb2.Volume) -> Path:
        return self.agent.store.volume_path(volume.volume_id.rsplit(".", 1)[1])


@pytest.fixture
async def stack(tmp_path: Path, alluxio: Alluxio) -> AsyncIterator[Stack]:
    (tmp_path / "pool").mkdir()
    registry = CollectorRegistry()
    rest = AlluxioRest(alluxio.cluster.proxy_url, alluxio.cluster.job_url, timeout=20, attempts=3)
    hydrator = Hydrator(rest, JobServiceLoader(rest), Filesystems(SubprocessExecutor()), DatasetMetrics(registry))
    agent = TargetAgent(
        name="store-a",
        nvmet=Nvmet(plain_configfs(tmp_path / "nvmet"), plain_tree=True),
        store=FileStore(tmp_path / "pool"),
        state=StateStore(tmp_path / "state"),
        portals=PORTALS,
        filler=DatasetVolumes(
            hydrator,
            tmp_path / "pool" / ".hydrate",
            (str(alluxio.dataset.root.parent), str(tmp_path)),
            holders=DatasetHolders(rest, "store-a"),
        ),
    )
    agent.converge()  # as the agent process does at start (prepares the pool)
    backend = AgentBackend(FABRIC, client=lambda _: LocalAgent(agent))
    sock = tmp_path / "ctrl.sock"
    server = build_server(CsiServices(volumes=VolumeService(backend, HostNqnNodes()), checks=[]))
    bind(server, Endpoint.parse(f"unix://{sock}"))
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{sock}")
    yield Stack(agent, registry, hydrator, csi_pb2_grpc.ControllerStub(channel), tmp_path / "pool")
    await channel.close(None)
    await server.stop(1)


def files_in_volume(backing: Path, dest: Path) -> dict[str, str]:
    """Every file of the ext4 filesystem in ``backing`` (read with debugfs, no mount) -> sha256."""
    dest.mkdir(parents=True)
    subprocess.run(["debugfs", "-R", f"rdump / {dest}", str(backing)], check=True, capture_output=True, timeout=600)
    return {
        str(p.relative_to(dest)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(dest.rglob("*"))
        if p.is_file() and "lost+found" not in p.parts
    }


def worker_bytes(alluxio: Alluxio) -> tuple[float, float]:
    """(bytes the worker read from the under-store, bytes it served to clients) from its own metrics."""
    metrics = alluxio.rest.metrics(alluxio.cluster.worker_web_url)
    ufs = sum(v for k, v in metrics.items() if k.startswith("Worker.BytesReadPerUfs."))
    served = sum(v for k, v in metrics.items() if k.startswith(("Worker.BytesReadRemote", "Worker.BytesReadDomain")))
    return ufs, served


# -- the client on its own ---------------------------------------------------------------------------------
async def test_cold_then_warm_hydration_pin_and_release(
    stack: Stack, alluxio: Alluxio, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = alluxio.dataset
    params = {"dataset.uri": str(ds.root), "dataset.path": "/datasets/train", "dataset.ttl": "86400"}
    with scraped(stack.registry, tmp_path / "prometheus") as prom:  # the dashboard's dataset panels, for real
        start = time.time()
        begin = time.monotonic()
        vol_a = await stack.create("train-a", params)
        cold_s = time.monotonic() - begin
        ufs0, served0 = worker_bytes(alluxio)
        begin = time.monotonic()
        vol_b = await stack.create("train-b", params)
        warm_s = time.monotonic() - begin
        ufs1, served1 = worker_bytes(alluxio)
        await asyncio.sleep(3)  # a few scrapes after the warm hydration
        queries = [q for q in panel_queries("5s") if q.panel in DATASET_PANELS]
        doc = prom.query(ranged=[q.expr for q in queries], start=start, end=time.time(), step=1)
    assert len(queries) == 2 and all(has_data(doc["range"][q.expr]) for q in queries), doc["range"]
    ratios = doc["range"]["nvmeof_csi_dataset_cache_hit_ratio"][0]["values"]
    assert float(ratios[-1][1]) >= 0.9, ratios[-5:]  # the warm hydration's ratio, as Prometheus has it
    for title in DATASET_PANELS:
        render(
            title, [q for q in queries if q.panel == title], doc["range"], start, RESULTS / f"panel-{slug(title)}.png"
        )

    from_ufs, served = ufs1 - ufs0, served1 - served0
    hit = 1 - from_ufs / ds.bytes  # every byte of B was read (checksums below); Alluxio says how many came from the UFS
    with capsys.disabled():
        print(
            f"\nalluxio: {len(ds.checksums)} files, {ds.bytes / MiB:.0f} MiB; cold {cold_s:.1f}s, warm {warm_s:.1f}s; "
            f"volume B: worker served {served / MiB:.0f} MiB, read {from_ufs / MiB:.1f} MiB from the UFS "
            f"-> {100 * hit:.1f}% from cache"
        )
    assert served >= 0.9 * ds.bytes, "volume B's bytes did not come through the Alluxio worker"
    assert hit >= 0.90, f"only {100 * hit:.1f}% of volume B's bytes came from the cache"

    for vol, name in ((vol_a, "a"), (vol_b, "b")):
        assert files_in_volume(stack.backing(vol), tmp_path / name) == ds.checksums, f"volume {name} differs"
    labels_b = stack.agent.get_volume(name="train-b").record.labels
    assert float(labels_b["dataset.hitRatio"]) >= 0.9 and labels_b["dataset.files"] == str(len(ds.checksums))
    assert float(stack.agent.get_volume(name="train-a").record.labels["dataset.hitRatio"]) < 0.1  # cold
    assert labels_b["dataset.workers"] == "127.0.0.1"
    assert (
        'nvmeof_csi_dataset_bytes_total{dataset="/datasets/train",source="cache"}'
        in generate_latest(stack.registry).decode()
    )

    # locality: the worker next to store-a holds the data set, so a dataset volume goes there even though
    # store-b has more room; and the node labels a scheduler can use
    held = bytes_by_host(alluxio.rest, "/datasets/train")
    assert held.get("127.0.0.1", 0) >= 0.9 * ds.bytes, held
    two = FabricMap(
        (
            AgentEntry("store-a", Endpoint.parse("unix:///a"), "f1", alluxio_host="127.0.0.1"),
            AgentEntry("store-b", Endpoint.parse("unix:///b"), "f1", alluxio_host="10.9.9.9"),
        )
    )
    near = AgentBackend(two, client=lambda _: LocalAgent(stack.agent), locality=CacheLocality(alluxio.rest))
    cached = near._cached_near(DatasetSpec.from_parameters(params))
    assert cached == {"store-a": held["127.0.0.1"], "store-b": 0}
    roomier = [Candidate(two.agents[0], 1 << 30), Candidate(two.agents[1], 1 << 40)]
    assert place(roomier, 512 * MiB, "tcp", None, cached).name == "store-a"
    assert place(roomier, 512 * MiB, "tcp", None, {}).name == "store-b"
    out = CliRunner().invoke(
        cli_app, ["-o", "json", "datasets", "labels", "/datasets/train", "--alluxio-proxy", alluxio.cluster.proxy_url]
    )
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [r["host"] for r in rows] == ["127.0.0.1"] and rows[0]["label"].startswith("dataset.csi.nvmeof.io/")

    sample = "/datasets/train/" + sorted(ds.checksums)[0]
    status = alluxio.rest.get_status("/datasets/train")
    assert status.pinned and status.ttl_ms == 86_400_000 and status.ttl_action == "FREE"
    await stack.delete(vol_a.volume_id)
    assert alluxio.rest.get_status(sample).pinned, "B still references the data set: it must stay pinned"
    assert alluxio.rest.get_status(sample).in_alluxio_percentage == 100
    # another agent (store-b) holds a volume of the same data set: store-a's last delete must not release it
    store_b = DatasetVolumes(stack.hydrator, tmp_path / "b-work", holders=DatasetHolders(alluxio.rest, "store-b"))
    assert store_b.holders is not None
    spec = DatasetSpec.from_parameters(params)
    assert spec is not None
    store_b.holders.hold(spec)
    await stack.delete(vol_b.volume_id)
    assert alluxio.rest.get_status(sample).pinned, "store-b still holds the data set: it must stay pinned"
    store_b.release(spec, [])  # store-b's last volume of it goes: now nobody holds it
    assert not alluxio.rest.get_status(sample).pinned
    assert not alluxio.rest.exists(DatasetHolders.folder(spec)), "the holders' folder outlived the last holder"
    assert wait_until(lambda: alluxio.rest.get_status(sample).in_alluxio_percentage == 0, 60), "not freed"
    assert stack.agent.list_volumes() == []
    assert list((stack.pool / "volumes").iterdir()) == []


async def test_alluxio_killed_mid_hydration_is_unavailable_then_the_retry_succeeds(
    stack: Stack, alluxio: Alluxio, tmp_path: Path
) -> None:
    ds: Dataset = make_dataset(tmp_path / "kill-ufs", files=300, seed=11)
    params = {"dataset.uri": str(ds.root), "dataset.path": "/datasets/kill"}
    killed = threading.Event()

    def kill_when_copying() -> None:
        def copying() -> bool:
            try:
                return "copying" in stack.agent.get_volume(name="kill-a").progress
            except Exception:  # not created yet
                return False

        if wait_until(copying, 300):
            alluxio.cluster.kill()
            killed.set()

    killer = threading.Thread(target=kill_when_copying)
    killer.start()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.create("kill-a", params)
    killer.join()
    assert killed.is_set(), "hydration finished before Alluxio could be killed"
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert stack.agent.list_volumes() == [], "a half-created volume was left"
    assert list((stack.pool / "volumes").iterdir()) == [], "a backing file was left"
    assert not any((stack.pool / ".hydrate").iterdir()), "a hydration work folder was left"

    await asyncio.to_thread(alluxio.cluster.restart)
    vol = await stack.create("kill-a", params)
    assert files_in_volume(stack.backing(vol), tmp_path / "kill-check") == ds.checksums
    await stack.delete(vol.volume_id)
    assert stack.agent.list_volumes() == []


def test_agent_killed_mid_hydration_resumes_after_restart(alluxio: Alluxio, tmp_path: Path) -> None:
    """A real agent process, SIGKILLed while copying: restarted, it serves at once and finishes the volume in
    the background from its journal (files already copied are not read again)."""
    ds = make_dataset(tmp_path / "resume-ufs", files=300, seed=23)
    work = tmp_path / "agent"
    extra = [
        "--alluxio-proxy",
        alluxio.cluster.proxy_url,
        "--alluxio-job",
        alluxio.cluster.job_url,
        "--dataset-ufs-allow",
        str(ds.root.parent),
    ]
    params = {"dataset.uri": str(ds.root), "dataset.path": "/datasets/resume", "dataset.pin": "false"}
    running = start_agent(work, extra)

    def client() -> AgentClient:
        return AgentClient(AgentTarget("store-a", Endpoint.parse(running.unix)), 30)

    def create() -> None:
        with contextlib.suppress(DriverError), client() as c:
            c.create_volume("resume-a", 512 * MiB, params, timeout=600)

    creator = threading.Thread(target=create)
    creator.start()

    def journals() -> list[Path]:
        return list((work / "pool" / ".hydrate").glob("*/journal.jsonl"))

    try:
        assert wait_until(lambda: bool(journals()) and len(journals()[0].read_text().splitlines()) >= 30, 300)
        running.proc.kill()
        running.proc.wait(30)
        creator.join(60)
        copied_before = len(journals()[0].read_text().splitlines())
        vol_uuid = journals()[0].parent.name
        log_size = (work / "agent.log").stat().st_size

        (work / "agent.sock").unlink()  # the killed agent's socket file (start_agent waits for a new one)
        running = start_agent(work, extra)  # serves right away; the hydration resumes in the background

        def ready(c: AgentClient) -> bool:
            try:
                return c.get_volume(vol_uuid).status == "ready"
            except DriverError:
                return False

        with client() as c:
            assert wait_until(lambda: ready(c), 600), (work / "agent.log").read_text()[-3000:]
            labels = dict(c.get_volume(vol_uuid).labels)
        after = (work / "agent.log").read_text()[log_size:]
        assert "dataset hydration resumes in the background" in after
        assert "resumed fill finished" in after
        assert labels["dataset.files"] == "300"
        assert files_in_volume(work / "pool" / "volumes" / f"{vol_uuid}.img", tmp_path / "check") == ds.checksums
        assert copied_before < 300, "the kill came too late to test resuming"
        with client() as c:
            c.delete_volume(vol_uuid)
            assert c.list_volumes() == []
    finally:
        running.proc.kill()
        running.proc.wait(30)
