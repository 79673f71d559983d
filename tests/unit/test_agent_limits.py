"""The node's reconcile pass reads limits with one listing per agent (``AgentLimits.for_pass``), not one call per
volume; the agent asked is the one the volume ID names; an agent that cannot be listed is asked once per pass."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from nvmeof_csi.agentclient.limits import AgentClients, AgentLimits
from nvmeof_csi.errors import Unavailable
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.topology.fabric_map import parse_fabric_map

FABRIC = parse_fabric_map(
    {"agents": [{"name": n, "endpoint": f"unix:///nowhere/{n}", "fabric": "f1"} for n in ("store-a", "store-b")]}
)


class Agent:
    """Volumes with limits; counts the calls the node makes; ``down`` raises ``Unavailable``."""

    def __init__(self, uuids: list[str]) -> None:
        self.volumes = {u: pb.Volume(uuid=u, parameters={"readIops": "100", "other": "x"}) for u in uuids}
        self.calls: Counter[str] = Counter()
        self.down = False

    def list_volumes(self) -> list[pb.Volume]:
        self.calls["ListVolumes"] += 1
        if self.down:
            raise Unavailable("down")
        return list(self.volumes.values())

    def get_volume(self, vol_uuid: str = "", name: str = "") -> pb.Volume:
        self.calls["GetVolume"] += 1
        return self.volumes[vol_uuid]


def record(agent: str, uuid: str, context: dict[str, str] | None = None) -> Any:
    return SimpleNamespace(ref=VolumeRef(agent, uuid), context=context or {})


def test_a_pass_lists_each_agent_once_whatever_the_number_of_volumes() -> None:
    uuids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(200)]
    agents = {"store-a": Agent(uuids[:150]), "store-b": Agent(uuids[150:])}
    limits = AgentLimits(AgentClients(FABRIC, lambda e: agents[e.name]))  # type: ignore[arg-type,return-value]
    source = limits.for_pass()
    seen = [source(record("store-a" if i < 150 else "store-b", u)) for i, u in enumerate(uuids)]
    assert seen == [{"readIops": "100"}] * 200
    assert agents["store-a"].calls == Counter({"ListVolumes": 1}) and agents["store-b"].calls["ListVolumes"] == 1
    assert limits(record("store-a", uuids[0], {"agent": "store-b"})) == {"readIops": "100"}  # the ID's agent only
    assert agents["store-a"].calls["GetVolume"] == 1 and agents["store-b"].calls["GetVolume"] == 0


def test_an_agent_that_cannot_be_listed_is_asked_once_per_pass() -> None:
    uuids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(5)]
    agent = Agent(uuids)
    agent.down = True
    source = AgentLimits(AgentClients(FABRIC, lambda e: agent)).for_pass()  # type: ignore[arg-type,return-value]
    with pytest.raises(Unavailable):
        source(record("store-a", uuids[0]))
    assert [source(record("store-a", u)) for u in uuids[1:]] == [None] * 4
    assert agent.calls == Counter({"ListVolumes": 1})
