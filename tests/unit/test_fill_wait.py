"""A long dataset fill holds a controller worker at most until the caller's deadline: the controller stops
waiting with ABORTED (the fill goes on on the agent), and a retry watches the volume without tying up an
agent thread, returning it once the agent reports it ready."""

from __future__ import annotations

from typing import Any

import pytest

from nvmeof_csi.errors import Aborted, DeadlineExceeded, NotFound
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.topology.fabric_map import parse_fabric_map
from tests.support.fakes import FakeClock

DATASET = {"dataset.path": "/datasets/imagenet"}
UUID = "0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01"


class SlowFillAgent:
    """An agent whose create outlives every deadline; ``polls`` get_volume calls later it is ready."""

    def __init__(self, ready_after: int) -> None:
        self.ready_after = ready_after
        self.creates: list[float | None] = []
        self.polls = 0
        self.exists = False
        self.reserved: pb.Reservation | None = None

    def _vol(self, status: str) -> pb.Volume:
        return pb.Volume(
            uuid=UUID,
            name="ds",
            capacity_bytes=1 << 30,
            parameters=DATASET,
            status=status,
            nqn="nqn.2026-11.io.nvmeof:vol:" + UUID,
            namespace_uuid=UUID,
            labels={"dataset.progress": "40%"} if status == "creating" else {},
        )

    def create_volume(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> pb.Volume:
        self.creates.append(timeout)
        self.exists = True
        raise DeadlineExceeded("agent store-a: Deadline Exceeded")

    def reserve_name(self, name: str, vol_uuid: str, agent: str) -> pb.Reservation:
        self.reserved = self.reserved or pb.Reservation(name=name, volume_uuid=vol_uuid, agent=agent)
        return self.reserved

    def lookup_name(self, name: str) -> pb.Reservation | None:
        return self.reserved

    def get_volume(self, vol_uuid: str = "", name: str = "") -> pb.Volume:
        if not self.exists:
            raise NotFound(f"no volume {name or vol_uuid}")
        if vol_uuid:  # the controller watching the fill
            self.polls += 1
        return self._vol("ready" if self.polls >= self.ready_after else "creating")

    def capacity(self) -> list[pb.Pool]:
        return [pb.Pool(name="pool", free_bytes=1 << 40, total_bytes=1 << 40)]

    def health(self) -> pb.HealthResponse:
        return pb.HealthResponse(ready=True)


def backend(agent: SlowFillAgent, clock: FakeClock) -> AgentBackend:
    fabric = parse_fabric_map({"agents": [{"name": "store-a", "endpoint": "unix:///nowhere", "fabric": "f1"}]})
    return AgentBackend(fabric, client=lambda _e: agent, sleep=clock.sleep, clock=clock)  # type: ignore[arg-type,return-value]


def test_a_fill_past_the_deadline_is_aborted_and_a_retry_returns_it_when_ready() -> None:
    agent, clock = SlowFillAgent(ready_after=12), FakeClock(min_step=0.01)
    b = backend(agent, clock)
    with pytest.raises(Aborted, match="still being filled"):
        b.create_volume("ds", 1 << 30, VolumeParameters.parse(DATASET), wait=5.0)
    assert agent.creates == [5.0]  # the agent call was bounded by the caller's deadline, not an hour
    with pytest.raises(Aborted, match=r"still being filled on agent store-a \(40%\)"):
        b.create_volume(
            "ds", 1 << 30, VolumeParameters.parse(DATASET), wait=5.0
        )  # the retry watches; it never calls create again
    assert agent.creates == [5.0] and 5.0 <= clock.now <= 6.1
    vol = b.create_volume("ds", 1 << 30, VolumeParameters.parse(DATASET), wait=30.0)
    assert vol.ready and vol.ref.uuid == UUID and agent.creates == [5.0]


def test_without_a_deadline_the_wait_is_the_backend_bound() -> None:
    agent, clock = SlowFillAgent(ready_after=10**9), FakeClock(min_step=0.01)
    with pytest.raises(Aborted):
        backend(agent, clock).create_volume("ds", 1 << 30, VolumeParameters.parse(DATASET), wait=None)
    assert agent.creates == [3600.0]
