"""The controller's cache of agents' free capacity: bounded staleness, parallel reads, a dead agent asked in the
background only (``fleet/capacity.py``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from nvmeof_csi.errors import Unavailable
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.fleet.capacity import CapacityCache
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap, parse_fabric_map
from tests.support.agents import local_agents


def fabric(n: int) -> FabricMap:
    return parse_fabric_map(
        {"agents": [{"name": f"a{i}", "endpoint": f"unix:///nowhere/{i}", "fabric": "f1"} for i in range(n)]}
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Agents:
    """Free bytes per agent name; counts every question; ``down`` agents raise ``Unavailable``."""

    def __init__(self) -> None:
        self.free: dict[str, int] = {}
        self.down: set[str] = set()
        self.asked: Counter[str] = Counter()

    def __call__(self, entry: AgentEntry) -> int:
        self.asked[entry.name] += 1
        if entry.name in self.down:
            raise Unavailable(f"{entry.name} does not answer")
        return self.free.get(entry.name, 1000)


def eventually(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_figures_are_reused_while_fresh_and_read_again_in_the_background_after() -> None:
    agents, clock, entries = Agents(), Clock(), fabric(3).agents
    cache = CapacityCache(agents, clock, fresh_for=10, down_for=30)
    assert [c.free_bytes for c in cache.candidates(entries)] == [1000, 1000, 1000]
    clock.now += 9
    cache.candidates(entries)
    assert agents.asked == Counter({"a0": 1, "a1": 1, "a2": 1})  # one question per agent per window
    agents.free["a0"] = 7
    clock.now += 1
    assert [c.free_bytes for c in cache.candidates(entries)] == [1000, 1000, 1000]  # stale, used while read again
    eventually(lambda: agents.asked == Counter({"a0": 2, "a1": 2, "a2": 2}))
    eventually(lambda: [c.free_bytes for c in cache.candidates(entries)] == [7, 1000, 1000])
    cache.close()


def test_spent_counts_until_read_again_and_forget_reads_at_once() -> None:
    agents, clock, entries = Agents(), Clock(), fabric(2).agents
    cache = CapacityCache(agents, clock)
    cache.candidates(entries)
    cache.spent("a0", 300)
    assert {c.agent.name: c.free_bytes for c in cache.candidates(entries)} == {"a0": 700, "a1": 1000}
    agents.free["a1"] = 5
    cache.forget("a1")
    assert {c.agent.name: c.free_bytes for c in cache.candidates(entries)} == {"a0": 700, "a1": 5}
    cache.forget_all()
    assert {c.agent.name: c.free_bytes for c in cache.candidates(entries)} == {"a0": 1000, "a1": 5}


def test_stale_agents_are_read_in_parallel() -> None:
    """Three stale agents answer only when all three are asked at once: a serial reader would break the barrier."""
    barrier = threading.Barrier(3, timeout=10)
    agents = Agents()

    def ask(entry: AgentEntry) -> int:
        barrier.wait()
        return agents(entry)

    cache = CapacityCache(ask, Clock())
    assert len(cache.candidates(fabric(3).agents)) == 3
    cache.close()


def test_a_dead_agent_is_asked_once_then_only_in_the_background() -> None:
    agents, clock, entries = Agents(), Clock(), fabric(2).agents
    agents.down.add("a1")
    cache = CapacityCache(agents, clock, fresh_for=10, down_for=30)
    assert [c.agent.name for c in cache.candidates(entries)] == ["a0"]
    clock.now += 20  # a0 stale (read again in the background), a1 still inside its down window: not asked
    cache.candidates(entries)
    eventually(lambda: agents.asked["a0"] == 2)
    assert agents.asked["a1"] == 1
    release = threading.Event()

    def slow(entry: AgentEntry) -> int:  # the dead agent's probe hangs until released
        if entry.name == "a1":
            release.wait(10)
        return agents(entry)

    cache._ask = slow  # the same cache, a probe that takes its time
    agents.down.clear()
    clock.now += 15
    assert [c.agent.name for c in cache.candidates(entries)] == ["a0"]  # did not wait for the probe
    release.set()
    eventually(lambda: [c.agent.name for c in cache.candidates(entries)] == ["a0", "a1"])  # back once it answered
    cache.close()


def test_placement_reads_fresh_figures_before_it_says_nothing_fits(tmp_path: Path) -> None:
    agent = local_agents(tmp_path, ["a0"])["a0"]
    agent.free = 0
    backend = AgentBackend(fabric(1), client=lambda _entry: agent, clock=Clock())
    with pytest.raises(Exception, match="no agent offers"):
        backend.create_volume("v0", 1 << 20, VolumeParameters.parse({}))
    agent.free = 1 << 30  # room now, while the cached figure (0) is still fresh
    assert backend.create_volume("v1", 1 << 20, VolumeParameters.parse({})).capacity_bytes == 1 << 20


def test_an_agent_that_answers_unavailable_for_a_create_stays_in_placement(tmp_path: Path) -> None:
    """UNAVAILABLE from a create can be the agent's answer about something else (Alluxio down for a data set): the
    agent is read again, not taken out of placement (that left the next create OUT_OF_RANGE with 0 bytes)."""
    agent = local_agents(tmp_path, ["a0"])["a0"]
    backend = AgentBackend(fabric(1), client=lambda _entry: agent, clock=Clock())

    def refuse() -> None:
        raise Unavailable("Alluxio at http://127.0.0.1:1 unreachable")

    agent.before_create = refuse
    with pytest.raises(Unavailable):
        backend.create_volume("v0", 1 << 20, VolumeParameters.parse({}))
    agent.before_create = lambda: None
    assert backend.max_volume_size() > 0
    assert backend.create_volume("v0", 1 << 20, VolumeParameters.parse({})).capacity_bytes == 1 << 20
