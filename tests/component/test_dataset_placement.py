"""A dataset volume placed next to its cached copy, through the controller's public path: CSI CreateVolume over
gRPC, the agent backend with a cache locality (which Alluxio worker holds how many of the data set's bytes), and
real target-agent logic behind it (in-process, plain configfs trees; the fill itself stands in, as the Alluxio
tier proves filling). Without the locality the same request lands where the most room is, so the test fails
when placement ignores the cache."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from pathlib import Path

import grpc

from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.agentclient.api import HostNqnNodes
from nvmeof_csi.csi.server import CsiServices, build_server
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.nvmeof.dataset import DatasetSpec
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import bind
from nvmeof_csi.service.provisioning import VolumeService
from nvmeof_csi.topology.fabric_map import parse_fabric_map
from tests.support.agents import LocalAgent, make_agent
from tests.support.requests import mount_cap

MiB, GiB, TiB = 1 << 20, 1 << 30, 1 << 40
FABRIC = parse_fabric_map(
    {
        "agents": [
            {"name": "store-a", "endpoint": "unix:///a", "fabric": "f1", "alluxioHost": "w1"},
            {"name": "store-b", "endpoint": "unix:///b", "fabric": "f1", "alluxioHost": "w2"},
            {"name": "store-c", "endpoint": "unix:///c", "fabric": "f1"},  # no cache, the most room
        ]
    }
)


class StandInFiller:
    """Fills nothing (the Alluxio tier proves filling); records which agent was asked to fill."""

    def __init__(self, name: str, filled: list[str]) -> None:
        self._name, self._filled = name, filled

    def fill(self, vol_uuid: str, spec: DatasetSpec, backing: Path, capacity: int) -> dict[str, str]:
        self._filled.append(self._name)
        return {"dataset.files": "1"}

    def progress(self, vol_uuid: str) -> str:
        return ""

    def discard(self, vol_uuid: str) -> None:
        return None

    def release(self, spec: DatasetSpec, others: Iterable[DatasetSpec]) -> None:
        return None

    def slot(self, wait: bool) -> AbstractContextManager[None]:
        return nullcontext()


@asynccontextmanager
async def controller(
    tmp: Path, locality: Callable[[DatasetSpec], Mapping[str, int]] | None, filled: list[str]
) -> AsyncIterator[csi_pb2_grpc.ControllerAsyncStub]:
    agents = {}
    for name, free in (("store-a", GiB), ("store-b", GiB), ("store-c", TiB)):
        base = make_agent(tmp / name, name=name)
        agent = TargetAgent(name, base.nvmet, base.store, base.state, base.portals,
                            filler=StandInFiller(name, filled))  # fmt: skip
        agent.converge()
        agents[name] = LocalAgent(agent, free=free)
    backend = AgentBackend(FABRIC, client=lambda e: agents[e.name], locality=locality)
    server = build_server(CsiServices(volumes=VolumeService(backend, HostNqnNodes()), checks=[backend.health]))
    bind(server, Endpoint.parse(f"unix://{tmp / 'ctrl.sock'}"))
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{tmp / 'ctrl.sock'}")
    try:
        yield csi_pb2_grpc.ControllerStub(channel)
    finally:
        await channel.close(None)
        await server.stop(1)


def dataset_request(name: str) -> csi_pb2.CreateVolumeRequest:
    return csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MiB),
        volume_capabilities=[mount_cap()],
        parameters={"dataset.path": "/datasets/imagenet"},
    )


async def test_a_dataset_volume_is_made_on_the_agent_whose_worker_caches_most_of_it(tmp_path: Path) -> None:
    asked: list[str] = []
    filled: list[str] = []

    def locality(spec: DatasetSpec) -> dict[str, int]:
        asked.append(spec.path)
        return {"w1": 10 * MiB, "w2": 900 * MiB}  # store-b's worker holds most of the data set

    async with controller(tmp_path / "with", locality, filled) as stub:
        volume = (await stub.CreateVolume(dataset_request("train"))).volume
    assert volume.volume_id.split(".")[1] == "store-b" and filled == ["store-b"]
    assert asked == ["/datasets/imagenet"]
    filled.clear()
    async with controller(tmp_path / "without", None, filled) as stub:  # the mechanism off: room decides
        volume = (await stub.CreateVolume(dataset_request("train"))).volume
    assert volume.volume_id.split(".")[1] == "store-c" and filled == ["store-c"]
