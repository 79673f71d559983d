"""``service/fence_answers.py``: the controller's answers to DRBD's fence-peer calls, over fake agents and records.
The arbiter's rules themselves are ``tests/unit/test_arbiter.py``'s; the kernel's side ``tests/cluster``'s."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from nvmeof_csi.agentclient.api import ReplicaApi
from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.errors import NotFound, Unavailable
from nvmeof_csi.fleet.replica_agents import FleetReplicaAgents
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.service.arbiter import ReplicaRecord
from nvmeof_csi.service.failover import AgentStatus
from nvmeof_csi.service.fence_answers import FenceAnswers, FenceCall
from nvmeof_csi.topology.fabric_map import AgentEntry, parse_fabric_map

VOL = "5f0c2a6e-2d7b-4c59-9a83-0d6a1f2b7c11"


@dataclass
class Agents:
    calls: dict[str, list[FenceCall]] = field(default_factory=dict)
    answers: list[tuple[str, int, bool]] = field(default_factory=list)
    roles: list[tuple[str, str, int]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)

    def names(self) -> list[str]:
        return sorted({"s1", "s2", *self.calls})

    def fence_calls(self, agent: str) -> list[FenceCall]:
        if agent in self.down:
            raise Unavailable(f"agent {agent} unreachable")
        return list(self.calls.get(agent, []))

    def answer(self, call: FenceCall, peer_fenced: bool) -> bool:
        self.answers.append((call.agent, call.pid, peer_fenced))
        return True

    def set_role(self, agent: str, vol_uuid: str, role: str, epoch: int) -> None:
        if agent in self.down:
            raise Unavailable(f"agent {agent} unreachable")
        self.roles.append((agent, role, epoch))


@dataclass
class Records:
    record: ReplicaRecord | None
    version: int = 1
    race: bool = False  # another writer comes first once

    def read(self, vol_uuid: str) -> tuple[ReplicaRecord, str] | None:
        return None if self.record is None else (self.record, str(self.version))

    def replace(self, vol_uuid: str, record: ReplicaRecord, version: str) -> bool:
        if self.race or version != str(self.version):
            self.race = False
            self.version += 1
            return False
        self.record, self.version = record, self.version + 1
        return True


def primary_s1() -> ReplicaRecord:
    return ReplicaRecord(("s1", "s2"), "s1", epoch=3, since=3)


def test_the_primary_in_its_term_goes_on_after_its_peer_is_fenced_and_recorded_outdated() -> None:
    agents, records = Agents({"s1": [FenceCall("s1", VOL, 41, 3)]}), Records(primary_s1())
    counted: list[str] = []
    lines = FenceAnswers(agents, records, count=counted.append).run_once()
    assert counted == ["fenced"]  # the controller's nvmeof_csi_fence_peer_answers_total{answer="fenced"}
    assert records.record is not None and records.record.outdated == frozenset({"s2"}) and records.record.epoch == 4
    assert agents.roles == [("s2", "fenced", 4)] and agents.answers == [("s1", 41, True)]
    assert "one writer" in lines[0]


def test_a_primary_of_an_older_term_and_a_volume_without_a_record_stay_frozen() -> None:
    agents, records = Agents({"s1": [FenceCall("s1", VOL, 41, 1)]}), Records(primary_s1())  # made primary at 1
    counted: list[str] = []
    FenceAnswers(agents, records, count=counted.append).run_once()
    assert agents.answers == [("s1", 41, False)] and agents.roles == [] and records.version == 1
    assert counted == ["refused"]
    cut_off = Agents({"s2": [FenceCall("s2", VOL, 7, 3)]})  # the secondary asked to be promoted while cut off
    FenceAnswers(cut_off, records).run_once()
    assert cut_off.answers == [("s2", 7, False)]
    orphan = Agents({"s1": [FenceCall("s1", VOL, 9, 3)]})
    assert "no replica record" in FenceAnswers(orphan, Records(None)).run_once()[0]
    assert orphan.answers == [("s1", 9, False)]


def test_a_lost_compare_and_swap_leaves_the_call_waiting_and_the_next_pass_answers_it() -> None:
    agents, records = Agents({"s1": [FenceCall("s1", VOL, 41, 3)]}), Records(primary_s1(), race=True)
    answers = FenceAnswers(agents, records)
    assert "decided again" in answers.run_once()[0]
    assert agents.answers == [] and agents.roles == []
    answers.run_once()
    assert agents.answers == [("s1", 41, True)]


def test_an_unreachable_peer_is_held_outdated_by_the_record_and_an_unreachable_asker_waits() -> None:
    agents, records = Agents({"s1": [FenceCall("s1", VOL, 41, 3)]}, down={"s2"}), Records(primary_s1())
    lines = FenceAnswers(agents, records).run_once()
    assert agents.answers == [("s1", 41, True)] and records.record is not None and "s2" in records.record.outdated
    assert any("unreachable, held outdated" in line for line in lines)
    silent = Agents({"s1": [FenceCall("s1", VOL, 41, 3)]}, down={"s1"})
    assert "cannot be read" in FenceAnswers(silent, Records(primary_s1())).run_once()[0]
    assert silent.answers == []


@dataclass
class Client:
    """One agent's client as the fleet adapter uses it."""

    waiting: list[pb.FenceRequest]
    answered: list[tuple[str, int, bool]] = field(default_factory=list)
    roles: list[tuple[str, str, int]] = field(default_factory=list)
    down: bool = False

    def set_replica_role(self, vol_uuid: str, role: str, epoch: int, timeout: float | None = None) -> pb.Volume:
        self.roles.append((vol_uuid, role, epoch))
        return pb.Volume(uuid=vol_uuid)

    def fence_requests(self) -> list[pb.FenceRequest]:
        return self.waiting

    def health(self) -> pb.HealthResponse:
        if self.down:
            raise Unavailable("unreachable")
        return pb.HealthResponse(ready=True)

    def get_volume(self, vol_uuid: str = "", name: str = "") -> pb.Volume:
        return pb.Volume(uuid=vol_uuid, replica=pb.Replica(role="secondary", epoch=2, connection="WFConnection"))

    def answer_fence(self, vol_uuid: str, pid: int, peer_fenced: bool) -> bool:
        self.answered.append((vol_uuid, pid, peer_fenced))
        return True


def test_the_fleet_adapter_reaches_each_agent_of_the_map_and_the_pass_runs_over_it() -> None:
    fabric = parse_fabric_map(
        {"agents": [{"name": n, "endpoint": "unix:///nowhere", "fabric": "f"} for n in ("s1", "s2")]}
    )
    clients = {
        "s1": Client([pb.FenceRequest(volume_uuid=VOL, pid=41, role="primary", epoch=3)]),
        "s2": Client([]),
    }
    made: list[str] = []

    def factory(entry: AgentEntry) -> ReplicaApi:
        made.append(entry.name)
        return clients[entry.name]

    agents = FleetReplicaAgents(fabric, factory)
    records = Records(primary_s1())
    FenceAnswers(agents, records).run_once()
    assert clients["s1"].answered == [(VOL, 41, True)] and clients["s2"].roles == [(VOL, "fenced", 4)]
    assert sorted(made) == ["s1", "s2"]  # one client per agent, kept
    with pytest.raises(NotFound):
        agents.fence_calls("s9")
    clients["s2"].down = True
    assert (agents.status("s1"), agents.status("s2"), agents.status("s9")) == (AgentStatus(), None, None)
    assert agents.replica("s1", VOL).connection == "WFConnection"
    real: ReplicaApi = AgentClient(AgentTarget("s1", Endpoint.parse("unix:///nowhere")))  # the real client fits
    real.close()  # type: ignore[attr-defined]


def test_the_loop_answers_every_period_and_a_failed_pass_does_not_end_it() -> None:
    import threading

    class Flaky(Agents):
        passes = 0

        def names(self) -> list[str]:
            Flaky.passes += 1
            if Flaky.passes == 1:
                raise Unavailable("the map's first agent is down")
            if Flaky.passes == 3:
                stop.set()
            return super().names()

    stop = threading.Event()
    agents = Flaky(calls={"s1": [FenceCall("s1", VOL, 41, 3)]})
    FenceAnswers(agents, Records(primary_s1())).run(stop, period=0.01)
    assert Flaky.passes == 3 and (agents.answers[0][0], agents.answers[0][2]) == ("s1", True)
