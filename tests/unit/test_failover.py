"""The controller's failover pass (``service/failover.py``) over stand-in agents and records: a silent primary is
replaced only after the grace, only by a peer that lost it too and is UpToDate and not outdated; a promotion the
record holds is given again; a stale primary that returns is fenced, and an outdated one that resynced is made
secondary."""

from __future__ import annotations

from dataclasses import dataclass, field

from nvmeof_csi.errors import Unavailable
from nvmeof_csi.service.arbiter import ReplicaRecord
from nvmeof_csi.service.failover import AgentStatus, Failover, ReplicaState

VOL = "5f0c2a6e-2d7b-4c59-9a83-0d6a1f2b7c11"


@dataclass
class Agents:
    states: dict[str, ReplicaState]
    silent: set[str] = field(default_factory=set)
    roles: list[tuple[str, str, int]] = field(default_factory=list)
    draining: set[str] = field(default_factory=set)

    def status(self, agent: str) -> AgentStatus | None:
        return None if agent in self.silent else AgentStatus(draining=agent in self.draining)

    def replica(self, agent: str, vol_uuid: str) -> ReplicaState:
        if agent in self.silent:
            raise Unavailable(f"{agent} unreachable")
        return self.states[agent]

    def set_role(self, agent: str, vol_uuid: str, role: str, epoch: int) -> None:
        self.roles.append((agent, role, epoch))
        old = self.states[agent]
        self.states[agent] = ReplicaState(role, epoch, old.connection, old.disk, "Primary" if role == "primary" else "")


@dataclass
class Records:
    record: ReplicaRecord
    version: int = 1

    def volumes(self) -> list[str]:
        return [VOL]

    def read(self, vol_uuid: str) -> tuple[ReplicaRecord, str] | None:
        return self.record, str(self.version)

    def replace(self, vol_uuid: str, record: ReplicaRecord, version: str) -> bool:
        if version != str(self.version):
            return False
        self.record, self.version = record, self.version + 1
        return True


def pair(peer_connection: str = "WFConnection", peer_disk: str = "UpToDate") -> Agents:
    return Agents({
        "s1": ReplicaState("primary", 1, "Connected", "UpToDate", "Primary"),
        "s2": ReplicaState("secondary", 1, peer_connection, peer_disk, "Secondary"),
    })  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_silent_primary_is_replaced_after_the_grace_by_a_peer_that_lost_it_too() -> None:
    agents, records, clock = pair(), Records(ReplicaRecord(("s1", "s2"), "s1")), Clock()
    agents.silent.add("s1")
    counted: list[str] = []
    passes = Failover(agents, records, grace=15, clock=clock, count=counted.append)
    assert "silent for 0 s" in passes.run_once()[0] and not agents.roles
    clock.now += 16
    line = passes.run_once()[0]
    assert "'s2' promoted" in line and agents.roles == [("s2", "primary", 2)], line
    assert counted == ["unplanned"]  # nvmeof_csi_replica_moves_total{kind="unplanned"}
    assert (records.record.primary, records.record.outdated) == ("s2", frozenset({"s1"}))


def test_no_failover_while_the_peer_still_replicates_or_is_outdated_or_not_up_to_date() -> None:
    for agents, record, says in (
        (pair("Connected"), ReplicaRecord(("s1", "s2"), "s1"), "still replicates"),
        (pair(), ReplicaRecord(("s1", "s2"), "s1", outdated=frozenset({"s2"})), "outdated"),
        (pair(peer_disk="Inconsistent"), ReplicaRecord(("s1", "s2"), "s1"), "Inconsistent"),
    ):
        clock = Clock()
        agents.silent.add("s1")
        passes = Failover(agents, Records(record), grace=15, clock=clock)
        passes.run_once()
        clock.now += 60
        line = passes.run_once()[0]
        assert says in line and not agents.roles, line
    both = pair()
    both.silent |= {"s1", "s2"}
    clock = Clock()
    passes = Failover(both, Records(ReplicaRecord(("s1", "s2"), "s1")), grace=0, clock=clock)
    assert "both" in passes.run_once()[0] and not both.roles


def test_a_rebooted_stale_primary_is_made_secondary_for_drbd_to_resync() -> None:
    agents = pair()
    agents.states["s1"] = ReplicaState("primary", 1, "SyncTarget", "Inconsistent", "Secondary")
    agents.states["s2"] = ReplicaState("primary", 2, "SyncSource", "UpToDate", "Primary")
    record = ReplicaRecord(("s1", "s2"), "s2", epoch=2, since=2, outdated=frozenset({"s1"}))
    Failover(agents, Records(record), grace=15, clock=Clock()).run_once()
    assert agents.roles == [("s1", "secondary", 2)]


def test_a_promotion_the_record_holds_is_given_again_and_a_returning_replica_rejoins() -> None:
    agents = pair()
    agents.states["s2"] = ReplicaState("secondary", 1, "WFConnection", "UpToDate")
    record = ReplicaRecord(("s1", "s2"), "s2", epoch=2, since=2, outdated=frozenset({"s1"}))
    records = Records(record)
    agents.silent.add("s1")
    passes = Failover(agents, records, grace=15, clock=Clock())
    passes.run_once()  # the controller died between the record and the promotion: s2 is promoted now
    assert agents.roles[0] == ("s2", "primary", 2)
    agents.silent.discard("s1")
    agents.states["s1"] = ReplicaState("primary", 1, "WFConnection", "UpToDate", "Primary")
    passes.run_once()  # s1 is back and DRBD still holds it Primary of epoch 1: fenced in epoch 2
    assert agents.roles[1] == ("s1", "fenced", 2)
    agents.states["s1"] = ReplicaState("fenced", 2, "SyncTarget", "Inconsistent")
    passes.run_once()
    assert len(agents.roles) == 2 and "s1" in records.record.outdated  # still resyncing: nothing changes
    agents.states["s1"] = ReplicaState("fenced", 2, "Connected", "UpToDate")
    passes.run_once()
    assert agents.roles[2] == ("s1", "secondary", 3) and not records.record.outdated


def test_a_draining_primary_hands_over_to_its_in_sync_peer_and_the_peer_is_not_handed_back() -> None:
    agents, records = pair("Connected"), Records(ReplicaRecord(("s1", "s2"), "s1"))
    agents.draining.add("s1")
    counted: list[str] = []
    passes = Failover(agents, records, grace=15, clock=Clock(), count=counted.append)
    line = passes.run_once()[0]
    assert "planned switchover" in line and "'s2' is primary" in line, line
    assert agents.roles == [("s1", "handover", 2), ("s2", "primary", 2), ("s1", "secondary", 2)]
    assert counted == ["planned"]
    assert (records.record.primary, records.record.epoch, records.record.outdated) == ("s2", 2, frozenset())
    assert passes.run_once() == [] and len(agents.roles) == 3  # s2 serves; s1 (still draining) gets nothing back


def test_a_draining_primary_stays_when_its_peer_cannot_take_over() -> None:
    for agents, record, says in (
        (pair("WFConnection"), ReplicaRecord(("s1", "s2"), "s1"), "s2 is WFConnection"),
        (pair("Connected"), ReplicaRecord(("s1", "s2"), "s1", outdated=frozenset({"s2"})), "not in sync"),
        (pair("Connected", "Inconsistent"), ReplicaRecord(("s1", "s2"), "s1"), "not in sync (Inconsistent)"),
    ):
        agents.draining.add("s1")
        line = Failover(agents, Records(record), grace=15, clock=Clock()).run_once()[0]
        assert says in line and not agents.roles, line
    both = pair("Connected")
    both.draining |= {"s1", "s2"}
    line = Failover(both, Records(ReplicaRecord(("s1", "s2"), "s1")), grace=15, clock=Clock()).run_once()[0]
    assert "draining too" in line and not both.roles, line
    gone = pair("Connected")
    gone.draining.add("s1")
    gone.silent.add("s2")
    line = Failover(gone, Records(ReplicaRecord(("s1", "s2"), "s1")), grace=15, clock=Clock()).run_once()[0]
    assert "does not answer" in line and not gone.roles, line


def test_a_switchover_cut_short_after_the_record_finishes_on_the_next_pass() -> None:
    agents = pair("Connected")  # the record moved to s2, then the controller died: s1 still Primary, connected
    records = Records(ReplicaRecord(("s1", "s2"), "s2", epoch=2, since=2))
    passes = Failover(agents, records, grace=15, clock=Clock())
    passes.run_once()
    assert agents.roles == [("s1", "handover", 2), ("s2", "primary", 2)]
    assert "handed over; now secondary" in passes.run_once()[0]
    assert agents.roles[2] == ("s1", "secondary", 2)


def test_a_split_brain_is_resolved_as_the_record_says_the_other_replica_discards_and_resyncs() -> None:
    agents = pair(peer_connection="StandAlone")  # DRBD found both replicas changed: neither connects
    agents.states["s1"] = ReplicaState("primary", 2, "StandAlone", "UpToDate", "Primary")
    agents.states["s2"] = ReplicaState("fenced", 2, "StandAlone", "Outdated", "Secondary")
    records = Records(ReplicaRecord(("s1", "s2"), "s1", epoch=2, outdated=frozenset({"s2"})))
    counted: list[str] = []
    line = Failover(agents, records, count=counted.append).run_once()[0]
    assert agents.roles == [("s2", "discard", 2), ("s1", "primary", 2)], line  # the loser waits for the connect
    assert counted == ["split_brain"]
    assert "split brain (s2 StandAlone, s1 StandAlone) resolved as the record says: s2 discards" in line
    agents.roles.clear()
    agents.states["s2"] = ReplicaState("secondary", 2, "SyncTarget", "Inconsistent", "Secondary")
    agents.states["s1"] = ReplicaState("primary", 2, "SyncSource", "UpToDate", "Primary")
    assert Failover(agents, records).run_once() == [] and agents.roles == []  # resyncing: nothing to do
    agents.states["s1"] = ReplicaState("primary", 2, "StandAlone", "UpToDate", "Primary")  # only the primary
    agents.states["s2"] = ReplicaState("secondary", 2, "WFConnection", "Outdated", "Secondary")
    Failover(agents, records).run_once()
    assert agents.roles == [("s2", "discard", 2), ("s1", "primary", 2)]  # a discard that is not StandAlone: nothing
