"""Controllers racing on one CSI name agree through its reservation at the name's home agent
(``fleet/names.py``): one volume, whatever the agents' clocks say, after a crash between any two steps,
with a dead agent the request could not use; a delete frees the name; a refused create frees the reservation."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.agent.state import DELETING
from nvmeof_csi.agentclient.api import HostNqnNodes
from nvmeof_csi.errors import ResourceExhausted, Unavailable
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.service.contracts import TopologyRequirement, Volume
from nvmeof_csi.service.provisioning import CapacityRange, VolumeService
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from tests.support.agents import LocalAgent, local_agents

GiB = 1 << 30
NAMES = ["store-a", "store-b", "store-c"]
FABRIC = FabricMap(tuple(AgentEntry(n, Endpoint.parse(f"unix:///{n}"), "f1", "z1", ("tcp",)) for n in NAMES))


def service(view: dict[str, Any]) -> VolumeService:
    return VolumeService(AgentBackend(FABRIC, client=lambda e: view[e.name]), HostNqnNodes())


def views(agents: dict[str, LocalAgent]) -> tuple[dict[str, LocalAgent], dict[str, LocalAgent]]:
    """Two controllers' views: each sees a different agent as the emptiest, so each would place the name there."""
    return tuple(  # type: ignore[return-value]
        {n: LocalAgent(a.agent, free=(7 * GiB if n == mine else GiB)) for n, a in agents.items()}
        for mine in ("store-a", "store-b")
    )


def volumes_in_all(agents: dict[str, LocalAgent]) -> int:
    return sum(len(a.agent.list_volumes()) for a in agents.values())


def race(first: VolumeService, second: VolumeService, name: str) -> list[Volume]:
    results: list[Volume] = []
    threads = [
        threading.Thread(target=lambda s=s: results.append(s.create(name, CapacityRange(GiB), VolumeParameters())))
        for s in (first, second)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_two_controllers_that_both_missed_the_name_agree_whatever_the_agents_clocks(tmp_path: Path) -> None:
    """Both look the name up (nothing) and place it on different agents before either reserves; store-a's clock
    runs a day ahead. The reservation at the home decides: one volume, and both return it."""
    agents = local_agents(tmp_path, NAMES, capacity=8 * GiB, clocks={"store-a": lambda: time.time() + 86400})
    both_looked = threading.Barrier(2)
    view1, view2 = views(agents)
    for view in (view1, view2):
        waited: list[bool] = []

        def meet(waited: list[bool] = waited) -> None:
            if not waited:
                waited.append(True)
                both_looked.wait(60)

        for local in view.values():
            local.before_reserve = meet
    results = race(service(view1), service(view2), "racy")
    assert len(results) == 2 and results[0] == results[1]
    assert volumes_in_all(agents) == 1


@pytest.mark.parametrize(("pause", "winner"), [("before_reserve", "store-b"), ("before_create", "store-a")])
def test_a_controller_paused_between_any_two_steps_returns_the_volume_the_other_returned(
    tmp_path: Path,
    pause: str,
    winner: str,
) -> None:
    """Controller 1 stops after its lookup (or after reserving); controller 2 creates and returns its volume;
    controller 1 then goes on and must return that same volume, leaving one."""
    agents = local_agents(tmp_path, NAMES, capacity=8 * GiB)
    view1, view2 = views(agents)
    go, waiting = threading.Event(), threading.Event()

    def hold() -> None:
        waiting.set()
        assert go.wait(60)

    for local in view1.values():
        setattr(local, pause, hold)
    c1, c2 = service(view1), service(view2)
    first: list[Volume] = []
    t1 = threading.Thread(
        target=lambda: first.append(c1.create("late", CapacityRange(GiB), VolumeParameters.parse({})))
    )
    t1.start()
    assert waiting.wait(30)
    returned_by_2 = c2.create("late", CapacityRange(GiB), VolumeParameters.parse({}))
    go.set()
    t1.join(60)
    assert first == [returned_by_2] and returned_by_2.ref.location == winner
    assert volumes_in_all(agents) == 1


def test_a_controller_that_died_after_reserving_is_finished_by_the_next(tmp_path: Path) -> None:
    agents = local_agents(tmp_path, NAMES, capacity=8 * GiB)
    view1, view2 = views(agents)

    def crash() -> None:
        raise SystemExit("controller killed")

    for local in view1.values():
        local.before_create = crash
    with pytest.raises(SystemExit):
        service(view1).create("orphan", CapacityRange(GiB), VolumeParameters.parse({}))
    assert volumes_in_all(agents) == 0
    made = service(view2).create("orphan", CapacityRange(GiB), VolumeParameters.parse({}))
    assert made.ref.location == "store-a"  # where the dead controller's reservation put it, not view 2's choice
    assert volumes_in_all(agents) == 1


def test_a_delete_frees_the_name_and_a_new_create_makes_a_new_volume(tmp_path: Path) -> None:
    agents = local_agents(tmp_path, NAMES, capacity=8 * GiB)
    ctl = service(dict(agents))
    old = ctl.create("again", CapacityRange(GiB), VolumeParameters.parse({}))
    ctl.delete(old.ref)
    assert all(a.lookup_name("again") is None for a in agents.values())
    new = ctl.create("again", CapacityRange(GiB), VolumeParameters.parse({}))
    assert new.ref.uuid != old.ref.uuid and volumes_in_all(agents) == 1


def test_a_retried_delete_finishes_what_the_agent_left_half_deleted(tmp_path: Path) -> None:
    """A delete that failed half-way on the agent leaves its record ``deleting`` (GetVolume: NOT_FOUND); the CO's
    retry must still reach the agent's idempotent delete, not stop at the lookup."""
    agents = local_agents(tmp_path, NAMES, capacity=8 * GiB)
    ctl = service(dict(agents))
    made = ctl.create("half", CapacityRange(GiB), VolumeParameters.parse({}))
    agent = agents[made.ref.location].agent
    agent.state.put_volume(agent.state.current.volumes[made.ref.uuid].evolve(status=DELETING))
    ctl.delete(made.ref)
    assert made.ref.uuid not in agent.state.current.volumes
    assert not agent.store.volume_path(made.ref.uuid).exists()


def test_a_create_the_reserved_agent_refuses_for_space_frees_the_reservation(tmp_path: Path) -> None:
    agents = local_agents(tmp_path, NAMES, capacity=2 * GiB)
    stale = {n: LocalAgent(a.agent, free=(7 * GiB if n == "store-a" else 0)) for n, a in agents.items()}
    with pytest.raises(ResourceExhausted):
        service(stale).create("big", CapacityRange(4 * GiB), VolumeParameters.parse({}))
    assert all(a.lookup_name("big") is None for a in agents.values()) and volumes_in_all(agents) == 0


def test_a_volume_made_before_reservations_is_adopted_not_duplicated(tmp_path: Path) -> None:
    agents = local_agents(tmp_path, NAMES, capacity=8 * GiB)
    old = (
        agents["store-c"]
        .agent.create_volume("legacy", GiB, VolumeParameters.parse({}), {"csi.nvmeof.io/name": "legacy"})
        .record
    )
    view1, _ = views(agents)  # would place a new volume on store-a
    got = service(view1).create("legacy", CapacityRange(GiB), VolumeParameters.parse({}))
    assert (got.ref.location, got.ref.uuid) == ("store-c", old.uuid) and volumes_in_all(agents) == 1


class DeadAgent:
    """An agent that cannot be reached: every call is UNAVAILABLE."""

    def __getattr__(self, name: str) -> Any:
        def unreachable(*args: Any, **kwargs: Any) -> Any:
            raise Unavailable(f"agent store-c: connection refused ({name})")

        return unreachable


def test_a_dead_agent_fails_only_the_creates_that_could_have_used_it(tmp_path: Path) -> None:
    """store-c serves fabric f2 only and is down: a create for f1 neither asks it nor fails; a create for f2
    fails with UNAVAILABLE (store-c may keep that name: we cannot tell), and leaves nothing behind."""
    fabric = FabricMap((*FABRIC.agents[:2], AgentEntry("store-c", Endpoint.parse("unix:///c"), "f2", "z1", ("tcp",))))
    view: dict[str, Any] = {**local_agents(tmp_path, NAMES[:2], capacity=8 * GiB), "store-c": DeadAgent()}
    ctl = VolumeService(AgentBackend(fabric, client=lambda e: view[e.name]), HostNqnNodes())

    def on(fab: str) -> TopologyRequirement:
        return TopologyRequirement(requisite=({"topology.csi.nvmeof.io/fabric": fab},))

    made = ctl.create("on-f1", CapacityRange(GiB), VolumeParameters.parse({}), on("f1"))
    assert made.ref.location in ("store-a", "store-b")
    with pytest.raises(Unavailable, match="store-c"):
        ctl.create("on-f2", CapacityRange(GiB), VolumeParameters.parse({}), on("f2"))
    assert volumes_in_all({n: view[n] for n in NAMES[:2]}) == 1
