"""A tenant cannot exhaust a pool: snapshots count against the thin-provisioning limit as their sources do, and
past the pool's high-water mark no volume, snapshot or clone is made while the volumes already there keep working
(grants, I/O); GetCapacity reports what may still be made. Before, a snapshot + rewrite loop on one volume could
fill the pool, and every thin volume on the agent then got ENOSPC."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.agent import pool as pool_module
from nvmeof_csi.agent.api import AgentServicer
from nvmeof_csi.agent.pool import PoolUsage
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.errors import ResourceExhausted
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from tests.support.agents import make_agent

MiB = 1 << 20
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000b1"


def test_snapshots_count_against_the_limit(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, capacity=10 * MiB)
    agent.converge()
    vol = agent.create_volume("v", 4 * MiB, VolumeParameters.parse({}), {}).record
    agent.create_snapshot("s1", vol.uuid)
    assert agent.provisioned_bytes() == 8 * MiB  # before: 4 MiB, the snapshot was free
    with pytest.raises(ResourceExhausted, match="left to provision"):
        agent.create_snapshot("s2", vol.uuid)
    with pytest.raises(ResourceExhausted):
        agent.create_volume("w", 4 * MiB, VolumeParameters.parse({}), {})


def test_past_the_high_water_mark_nothing_new_is_made_and_what_exists_keeps_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = make_agent(tmp_path)
    agent = TargetAgent(base.name, base.nvmet, base.store, base.state, base.portals, high_water=90)
    agent.converge()
    vol = agent.create_volume("v", 4 * MiB, VolumeParameters.parse({}), {}).record
    full = [PoolUsage(100 * MiB, 5 * MiB, 95 * MiB)]
    monkeypatch.setattr(pool_module.FileStore, "usage", lambda self: full[0])
    for make in (
        lambda: agent.create_volume("w", MiB, VolumeParameters.parse({}), {}),
        lambda: agent.create_snapshot("s", vol.uuid),
        lambda: agent.create_volume("c", 4 * MiB, VolumeParameters.parse({}), {}, source_volume=vol.uuid),
        lambda: agent.resize_volume(vol.uuid, 8 * MiB),  # before: a resize skipped the high-water mark
    ):
        with pytest.raises(ResourceExhausted, match="high-water mark 90%"):
            make()
    assert HOST in agent.allow_host(vol.uuid, HOST).record.hosts  # what exists keeps working
    capacity = AgentServicer(agent, []).GetCapacity(pb.GetCapacityRequest(), None)  # type: ignore[arg-type]
    assert capacity.pools[0].free_bytes == 0  # 5 MiB free, 10 MiB kept for the volumes that exist
    full[0] = PoolUsage(100 * MiB, 50 * MiB, 50 * MiB)
    capacity = AgentServicer(agent, []).GetCapacity(pb.GetCapacityRequest(), None)  # type: ignore[arg-type]
    assert capacity.pools[0].free_bytes == 40 * MiB
    agent.create_volume("w", MiB, VolumeParameters.parse({}), {})


def test_two_creates_of_different_names_never_both_take_the_last_room(tmp_path: Path) -> None:
    """Before, the room check and the save that counts the bytes were apart: two names created at once each passed
    the check that only one fits, and the pool was over-provisioned."""
    agent = make_agent(tmp_path, capacity=10 * MiB)
    agent.converge()
    save = agent.state.put_volume
    first_checked = threading.Event()

    def slow_save(rec: Any, **kw: Any) -> Any:
        first_checked.set()
        time.sleep(0.3)  # the other create runs its check meanwhile
        return save(rec, **kw)

    agent.state.put_volume = slow_save  # type: ignore[method-assign,assignment]
    outcomes: dict[str, str] = {}

    def create(name: str) -> None:
        try:
            agent.create_volume(name, 6 * MiB, VolumeParameters(), {})
            outcomes[name] = "made"
        except ResourceExhausted:
            outcomes[name] = "refused"

    a = threading.Thread(target=create, args=("a",))
    a.start()
    first_checked.wait(5)
    b = threading.Thread(target=create, args=("b",))
    b.start()
    a.join(10)
    b.join(10)
    assert sorted(outcomes.values()) == ["made", "refused"], outcomes
    assert agent.provisioned_bytes() == 6 * MiB
