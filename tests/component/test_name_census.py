"""The name census (``fleet/census.py``): once every agent was listed, a name its home does not know is
asked of the agents the census saw it on only — a create asks one agent, not all, and a dead agent that never held
the name stops nothing — while a name kept away from its home (a changed map) is still found, and an incomplete
census falls back to asking every agent."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.errors import Unavailable
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from tests.support.agents import LocalAgent, local_agents

MiB = 1 << 20
NAMES = [f"store-{i}" for i in range(6)]


def fabric(names: list[str]) -> FabricMap:
    return FabricMap(tuple(AgentEntry(n, Endpoint.parse(f"unix:///{n}"), "f1", "z1", ("tcp",)) for n in names))


class Counting(LocalAgent):
    """A local agent that counts LookupName calls and can be switched off (``Unavailable``)."""

    def __init__(self, inner: LocalAgent, asked: Counter[str], name: str) -> None:
        super().__init__(inner.agent)
        self.asked, self.name, self.down = asked, name, False

    def lookup_name(self, name: str) -> pb.Reservation | None:
        self.asked[self.name] += 1
        if self.down:
            raise Unavailable(f"{self.name} does not answer")
        return super().lookup_name(name)

    def list_volumes(self) -> list[pb.Volume]:
        if self.down:
            raise Unavailable(f"{self.name} does not answer")
        return super().list_volumes()


@pytest.fixture
def agents(tmp_path: Path) -> tuple[dict[str, Counting], Counter[str]]:
    asked: Counter[str] = Counter()
    return {n: Counting(a, asked, n) for n, a in local_agents(tmp_path, NAMES).items()}, asked


def backend(agents: dict[str, Any], names: list[str] = NAMES) -> AgentBackend:
    return AgentBackend(fabric(names), client=lambda e: agents[e.name], census=True)


def test_a_complete_census_asks_only_the_home_for_a_new_name(agents: tuple[dict[str, Counting], Counter[str]]) -> None:
    view, asked = agents
    ctrl = backend(view)
    assert ctrl.census is not None
    ctrl.create_volume("before", MiB, VolumeParameters.parse({}))  # incomplete census: every agent is asked
    assert sum(asked.values()) == len(NAMES)
    assert ctrl.census.sweep()
    asked.clear()
    ctrl.create_volume("fresh", MiB, VolumeParameters.parse({}))
    assert sum(asked.values()) == 1  # the home only
    view[NAMES[-1]].down = True
    view[NAMES[-2]].down = True
    made = [
        ctrl.create_volume(f"while-two-are-dead-{i}", MiB, VolumeParameters.parse({}))
        for i in range(4)
        if _home_up(ctrl, view, i)
    ]
    assert made  # creates whose home answers go on: the dead agents never held those names


def _home_up(ctrl: AgentBackend, view: dict[str, Counting], i: int) -> bool:
    home = ctrl._names.home(f"while-two-are-dead-{i}", lambda _e: True)
    return home is not None and not view[home.name].down


def test_a_name_kept_away_from_its_home_is_still_found(agents: tuple[dict[str, Counting], Counter[str]]) -> None:
    """A volume made under a smaller map keeps its reservation on an agent that is not its home in the full map:
    the census saw it there, so the full map's controller finds it (one volume, not two)."""
    view, _ = agents
    old, ctrl = backend(view, NAMES[:2]), backend(view)
    name = next(
        n
        for n in (f"moved-home-{i}" for i in range(100))
        if old._names.home(n, lambda _e: True) != ctrl._names.home(n, lambda _e: True)
    )
    first = old.create_volume(name, MiB, VolumeParameters.parse({}))
    assert ctrl.census is not None and ctrl.census.sweep()
    again = ctrl.create_volume(name, MiB, VolumeParameters.parse({}))
    assert again.ref == first.ref
    assert sum(len(a.agent.list_volumes()) for a in view.values()) == 1


def test_an_agent_never_listed_keeps_the_census_incomplete(agents: tuple[dict[str, Counting], Counter[str]]) -> None:
    view, _ = agents
    view[NAMES[0]].down = True
    ctrl = backend(view)
    assert ctrl.census is not None
    assert not ctrl.census.sweep() and ctrl.census.where("x") is None
    view[NAMES[0]].down = False
    assert ctrl.census.sweep() and ctrl.census.where("x") == frozenset()
