"""A tenant cannot stall an agent with dataset claims (security round 3, point 6): a fill never waits for a slot
on an RPC thread (a new create with every slot busy is RESOURCE_EXHAUSTED before anything is saved; a retry of
one already begun is ABORTED and keeps its record), a CO's retry of a running create is ABORTED at the edge, and
the staging copies of fills running at once are reserved together and counted by the pool's high-water mark.

Before: a fill beyond the slots waited on its RPC thread holding the name lock (about 130 claims pinned all 128
threads for hours), and four concurrent fills each passed the free-space check alone."""

from __future__ import annotations

import shutil
import threading
from collections import namedtuple
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.agent.api import AGENT_LOCK_TABLE
from nvmeof_csi.agent.state import CREATING, READY
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.datasets.fill import DatasetVolumes
from nvmeof_csi.datasets.hydrate import POOL_RESERVE, HydrationResult, Hydrator
from nvmeof_csi.errors import Aborted, ResourceExhausted, SlotsBusy
from nvmeof_csi.nvmeof.dataset import DatasetSpec
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from tests.support.agents import make_agent

MiB = 1 << 20
DATASET = VolumeParameters.parse({"dataset.path": "/datasets/ds"})


class GatedHydrator:
    """Every hydration waits for ``gate`` (``entered`` tells one began)."""

    def __init__(self) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()

    def hydrate(self, spec: DatasetSpec, backing: Path, capacity: int, work: Path, report: Any) -> HydrationResult:
        self.entered.set()
        assert self.gate.wait(20)
        return HydrationResult(1, 1, 1, 0, ("w1",))

    def release(self, spec: DatasetSpec) -> None:
        pass


@contextmanager
def one_slot_taken(tmp_path: Path) -> Iterator[TargetAgent]:
    """An agent with one fill slot, held by the fill of volume "a" for the ``with`` block (released after)."""
    gated = GatedHydrator()
    base = make_agent(tmp_path)
    filler = DatasetVolumes(gated, tmp_path / "work", max_fills=1)  # type: ignore[arg-type]
    agent = TargetAgent(base.name, base.nvmet, base.store, base.state, base.portals, filler=filler)
    agent.converge()
    first = threading.Thread(target=lambda: agent.create_volume("a", MiB, DATASET, {}))
    first.start()
    try:
        assert gated.entered.wait(10)
        yield agent
    finally:
        gated.gate.set()
        first.join(20)


def test_a_create_with_every_fill_slot_busy_is_refused_at_once_and_leaves_nothing(tmp_path: Path) -> None:
    with one_slot_taken(tmp_path) as agent:
        with pytest.raises(SlotsBusy, match="all 1 fill slots of this agent are taken"):
            agent.create_volume("b", MiB, DATASET, {})  # before: waited here, on an RPC thread
        assert [v.name for v in agent.state.current.volumes.values()] == ["a"]  # nothing of "b" was saved
        assert isinstance(SlotsBusy("x"), ResourceExhausted)  # the controller may place "b" elsewhere
    assert agent.create_volume("b", MiB, DATASET, {}).record.status == READY


def test_a_retry_of_a_begun_fill_with_every_slot_busy_is_aborted_and_keeps_its_record(tmp_path: Path) -> None:
    with one_slot_taken(tmp_path) as agent:
        begun = agent.state.current.volumes[next(iter(agent.state.current.volumes))]
        agent.state.put_volume(begun.evolve(uuid="0e0e0e0e-0000-4000-8000-00000000000c", name="c"))  # a restart's
        with pytest.raises(Aborted, match="'c' waits for a fill slot"):
            agent.create_volume("c", MiB, DATASET, {})
        assert agent.state.current.volumes["0e0e0e0e-0000-4000-8000-00000000000c"].status == CREATING  # kept
    assert agent.create_volume("c", MiB, DATASET, {}).record.status == READY  # resumed once a slot was free


def test_a_retry_of_a_running_create_is_aborted_after_a_short_wait_and_racing_creates_still_line_up(
    tmp_path: Path,
) -> None:
    assert AGENT_LOCK_TABLE == {}  # the edge takes no key: racing creates of one name are served in turn
    with one_slot_taken(tmp_path) as agent:
        agent._parts.name_wait = 0.2  # the agent waits a minute; a fifth of a second here
        with pytest.raises(Aborted, match=r"'name:a' is still in progress after 0\.2 s"):
            agent.create_volume("a", MiB, DATASET, {})  # before: waited on its thread for the whole fill
    assert agent.create_volume("a", MiB, DATASET, {}).record.status == READY  # the fill done: the same volume


Usage = namedtuple("Usage", "total used free")


def test_staging_copies_of_fills_at_once_are_reserved_together_and_kept_under_the_high_water_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gib = 1 << 30
    usage = [Usage(100 * gib, 50 * gib, 50 * gib)]
    monkeypatch.setattr("nvmeof_csi.datasets.hydrate.shutil.disk_usage", lambda _path: usage[0])
    hydrator = Hydrator(None, None, None, None, high_water=90.0)  # type: ignore[arg-type]
    room = hydrator._staging_room  # the one step under test
    with room(tmp_path / "a", 30 * gib):
        # before: each passed alone (50 GiB free)
        with (
            pytest.raises(ResourceExhausted, match=f"{30 * gib} more reserved by running fills"),
            room(tmp_path / "b", 30 * gib),
        ):
            pass
        # 50 + 30 + 15 = 95 % of the pool, past 90 %
        with pytest.raises(ResourceExhausted, match="high-water mark"), room(tmp_path / "c", 15 * gib):
            pass
        with room(tmp_path / "d", 5 * gib):
            pass
    with room(tmp_path / "b", 30 * gib):  # "a" finished: its reservation went with it
        pass
    usage[0] = Usage(100 * gib, 99 * gib, gib)
    with pytest.raises(ResourceExhausted, match=f"keeping {POOL_RESERVE} in reserve"), room(tmp_path / "e", gib):
        pass
    assert shutil.disk_usage is not None
