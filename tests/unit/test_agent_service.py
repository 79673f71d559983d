"""The target agent's logic over a temp configfs tree and a temp pool."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.agent.state import CREATING, DELETING
from nvmeof_csi.agent.state import record_json as state_record_json
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
)
from nvmeof_csi.nvmeof.dataset import DatasetSpec
from nvmeof_csi.nvmeof.nqn import namespace_nguid, volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from tests.support.agents import make_agent

MiB = 1 << 20
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"


def test_create_materialises_file_subsystem_and_links(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    view = agent.create_volume("pvc-1", 64 * MiB, VolumeParameters.parse({"queueSize": "64"}), {"team": "ml"})
    rec = view.record
    image = agent.store.volume_path(rec.uuid)
    assert image.stat().st_size == 64 * MiB and image.stat().st_blocks == 0
    dump = agent.nvmet.dump()
    sub = dump["subsystems"][volume_nqn(rec.uuid)]
    assert sub["allow_any_host"] == "0" and sub["hosts"] == []
    assert sub["namespaces"]["1"]["device_uuid"] == rec.uuid
    assert sub["namespaces"]["1"]["device_nguid"] == namespace_nguid(rec.uuid) != rec.uuid
    assert all(volume_nqn(rec.uuid) in p["subsystems"] for p in dump["ports"].values())
    assert (
        agent.create_volume("pvc-1", 64 * MiB, VolumeParameters.parse({"queueSize": "64"}), {"team": "ml"}).record.uuid
        == rec.uuid
    )
    with pytest.raises(AlreadyExists):
        agent.create_volume("pvc-1", 128 * MiB, VolumeParameters.parse({"queueSize": "64"}), {})
    assert agent.get_volume(name="pvc-1").record.uuid == rec.uuid


def test_delete_removes_everything_and_repeats(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    rec = agent.create_volume("v", MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(rec.uuid, HOST)
    agent.delete_volume(rec.uuid)
    agent.delete_volume(rec.uuid)
    assert agent.nvmet.subsystems() == [] and agent.nvmet.hosts() == []
    assert agent.store.files() == [] and dict(agent.state.current.volumes) == {}
    assert all(p["subsystems"] == [] for p in agent.nvmet.dump()["ports"].values())
    with pytest.raises(NotFound):
        agent.get_volume(rec.uuid)


def test_restart_converge_changes_nothing(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    for i in range(3):
        rec = agent.create_volume(f"v{i}", MiB, VolumeParameters.parse({}), {}).record
        agent.allow_host(rec.uuid, HOST)
    agent.set_ana("b", "non-optimized")
    before = agent.nvmet.dump()
    report = make_agent(tmp_path).converge()
    assert report.applied == [] and report.unknown == [] and report.problems == []
    assert make_agent(tmp_path).nvmet.dump() == before


def test_crash_after_state_save_finishes_create_and_delete(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    done = agent.create_volume("keep", MiB, VolumeParameters.parse({}), {}).record
    # a create interrupted right after its record was saved: no file, no configfs yet
    pending = done.evolve(uuid="3f6c1f8e-0000-4000-8000-000000000001", name="half", status=CREATING)
    agent.state.put_volume(pending)
    # a delete interrupted after its tombstone: configfs and file still there
    agent.state.put_volume(done.evolve(status=DELETING))
    (agent.store.volumes / "x.tmp").write_bytes(b"partial clone")
    restarted = make_agent(tmp_path)
    report = restarted.converge()
    assert any("finished creating" in a for a in report.applied)
    assert any("finished deleting" in a for a in report.applied)
    assert set(restarted.state.current.volumes) == {pending.uuid}
    assert restarted.nvmet.subsystems() == [volume_nqn(pending.uuid)]
    assert restarted.store.files() == [restarted.store.volume_path(pending.uuid)]


def test_a_delete_whose_record_removal_a_power_cut_lost_is_finished_again(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    other = agent.create_volume("other", MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(other.uuid, HOST)
    gone = agent.create_volume("gone", MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(gone.uuid, HOST)
    agent.delete_volume(gone.uuid)
    record = tmp_path / "state" / "volumes" / f"{gone.uuid}.deleting.json"
    assert not record.exists()
    record.write_bytes(state_record_json(gone))  # what a lost (unflushed) unlink leaves after a power cut
    restarted = make_agent(tmp_path)
    report = restarted.converge()
    assert any("finished deleting" in a for a in report.applied) and report.problems == []
    assert set(restarted.state.current.volumes) == {other.uuid} and not record.exists()
    assert restarted.nvmet.allowed_hosts(volume_nqn(other.uuid)) == [HOST]  # a host another volume allows stays
    assert restarted.nvmet.hosts() == [HOST]
    with pytest.raises(NotFound):
        restarted.get_volume(gone.uuid)


def test_a_create_whose_ready_rename_a_power_cut_lost_is_finished_again(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    rec = agent.create_volume("kept", MiB, VolumeParameters.parse({}), {}).record
    agent.allow_host(rec.uuid, HOST)
    with open(agent.store.volume_path(rec.uuid), "r+b") as image:
        image.write(b"the pod's bytes")
    folder = tmp_path / "state" / "volumes"
    (folder / f"{rec.uuid}.json").rename(folder / f"{rec.uuid}.creating.json")  # the unflushed rename, lost
    restarted = make_agent(tmp_path)
    report = restarted.converge()
    assert any("finished creating" in a for a in report.applied) and report.problems == []
    again = restarted.get_volume(rec.uuid).record
    assert again.status == "ready" and again.name == "kept" and dict(again.hosts) == {HOST: ""}
    assert restarted.nvmet.allowed_hosts(volume_nqn(rec.uuid)) == [HOST]
    assert agent.store.volume_path(rec.uuid).read_bytes()[:15] == b"the pod's bytes"
    assert (
        restarted.create_volume("kept", MiB, VolumeParameters.parse({}), {}).record.uuid == rec.uuid
    )  # a retried create finds it


def test_unknown_objects_reported_then_pruned(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    agent.nvmet.ensure_subsystem("nqn.2026-11.io.nvmeof:vol:stray", "s", "m")
    (agent.store.volumes / "orphan.img").write_bytes(b"")
    report = make_agent(tmp_path).converge()
    assert sorted(report.unknown) == sorted(
        ["subsystem nqn.2026-11.io.nvmeof:vol:stray", f"file {agent.store.volumes / 'orphan.img'}"]
    )
    assert agent.nvmet.subsystems() == ["nqn.2026-11.io.nvmeof:vol:stray"]
    report = make_agent(tmp_path).converge(prune=True)
    assert len(report.pruned) == 2 and agent.nvmet.subsystems() == [] and agent.store.files() == []


def test_snapshot_and_clones_keep_data(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    src = agent.create_volume("src", 8 * MiB, VolumeParameters.parse({}), {}).record
    payload = os.urandom(MiB)
    with open(agent.store.volume_path(src.uuid), "r+b") as f:
        f.seek(3 * MiB)
        f.write(payload)
    snap = agent.create_snapshot("snap-1", src.uuid)
    assert agent.create_snapshot("snap-1", src.uuid) == snap
    with pytest.raises(AlreadyExists):
        agent.create_snapshot("snap-1", "another-volume")
    with open(agent.store.volume_path(src.uuid), "r+b") as f:
        f.seek(3 * MiB)
        f.write(b"\0" * MiB)  # the source changes after the snapshot
    from_snap = agent.create_volume(
        "from-snap", 16 * MiB, VolumeParameters.parse({}), {}, source_snapshot=snap.uuid
    ).record
    from_vol = agent.create_volume("from-vol", 8 * MiB, VolumeParameters.parse({}), {}, source_volume=src.uuid).record
    with open(agent.store.volume_path(from_snap.uuid), "rb") as f:
        f.seek(3 * MiB)
        assert f.read(MiB) == payload
    assert agent.store.volume_path(from_snap.uuid).stat().st_size == 16 * MiB
    with open(agent.store.volume_path(from_vol.uuid), "rb") as f:
        f.seek(3 * MiB)
        assert f.read(MiB) == b"\0" * MiB
    with pytest.raises(OutOfRange):
        agent.create_volume("too-small", MiB, VolumeParameters.parse({}), {}, source_snapshot=snap.uuid)
    with pytest.raises(NotFound):
        agent.create_volume(
            "no-source", 8 * MiB, VolumeParameters.parse({}), {}, source_snapshot="00000000-0000-0000-0000-000000000000"
        )
    assert [s.uuid for s in agent.list_snapshots(source_volume=src.uuid)] == [snap.uuid]
    agent.delete_snapshot(snap.uuid)
    agent.delete_snapshot(snap.uuid)
    assert agent.list_snapshots() == []


def test_hosts_resize_capacity_and_ana(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, capacity=10 * MiB)
    agent.converge()
    rec = agent.create_volume("v", 4 * MiB, VolumeParameters.parse({}), {}).record
    with pytest.raises(ResourceExhausted):
        agent.create_volume("w", 7 * MiB, VolumeParameters.parse({}), {})
    with pytest.raises(InvalidArgument, match="host NQN"):
        agent.allow_host(rec.uuid, "not an nqn")
    with pytest.raises(InvalidArgument, match="DH-HMAC-CHAP"):
        agent.allow_host(rec.uuid, HOST, "DHHC-1:00:secret:")  # malformed key (and the volume has no auth)
    assert agent.state.current.volumes[rec.uuid].hosts == {}  # nothing saved for a refused grant
    assert agent.allow_host(rec.uuid, HOST).record.hosts == {HOST: ""}
    assert agent.resize_volume(rec.uuid, 8 * MiB).record.capacity_bytes == 8 * MiB
    assert agent.store.volume_path(rec.uuid).stat().st_size == 8 * MiB
    revalidate = agent.nvmet.root / "subsystems" / volume_nqn(rec.uuid) / "namespaces" / "1" / "revalidate_size"
    assert revalidate.read_text() == "1"
    with pytest.raises(ResourceExhausted):
        agent.resize_volume(rec.uuid, 11 * MiB)
    portals = dict((p.port_id, s) for p, s in agent.set_ana("a", "inaccessible"))
    assert portals == {1: "inaccessible", 2: "optimized"}
    with pytest.raises(NotFound, match="portal group"):
        agent.set_ana("zz", "optimized")
    assert json.loads((agent.state.folder / "ana.json").read_text()) == {"a": "inaccessible"}
    assert oct((agent.state.folder / "ana.json").stat().st_mode & 0o777) == "0o600"


def test_fifty_concurrent_creates_over_ten_names_make_ten_volumes(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    start = threading.Barrier(50)

    def create(i: int) -> str:
        start.wait()
        return agent.create_volume(f"name-{i % 10}", MiB, VolumeParameters.parse({}), {}).record.uuid

    with ThreadPoolExecutor(50) as pool:
        uuids = list(pool.map(create, range(50)))
    assert len(set(uuids)) == 10 and len(agent.list_volumes()) == 10
    assert len(agent.nvmet.subsystems()) == 10 and len(agent.store.files()) == 10


class BrokenFiller:
    """A filler whose fill fails with a bug, not a domain error."""

    def __init__(self) -> None:
        self.discarded: list[str] = []
        self.released: list[str] = []

    def fill(self, vol_uuid: str, parameters: Any, backing: Path, capacity: int) -> dict[str, str]:
        backing.write_bytes(b"half")
        raise RuntimeError("bug in the filler")

    def progress(self, vol_uuid: str) -> str:
        return ""

    def discard(self, vol_uuid: str) -> None:
        self.discarded.append(vol_uuid)

    def release(self, spec: DatasetSpec, others: Any) -> None:
        self.released.append(spec.path)

    def slot(self, wait: bool) -> AbstractContextManager[None]:
        return nullcontext()


class QuickFiller(BrokenFiller):
    def fill(self, vol_uuid: str, parameters: Any, backing: Path, capacity: int) -> dict[str, str]:
        return {"dataset.files": "1"}


def test_only_a_volume_without_a_fill_leaves_its_ready_rename_unflushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finishing a create again after a power cut is harmless, filling a volume again is not."""
    from nvmeof_csi.agent import state as state_module

    agent = make_agent(tmp_path)
    agent = TargetAgent(agent.name, agent.nvmet, agent.store, agent.state, agent.portals, filler=QuickFiller())
    agent.converge()
    from nvmeof_csi.host.atomic import fsync_dir

    flushed: list[Path] = []

    def spy(folder: Path) -> None:
        flushed.append(folder)
        fsync_dir(folder)

    monkeypatch.setattr(state_module, "fsync_dir", spy)
    agent.create_volume("plain", MiB, VolumeParameters.parse({}), {})
    assert flushed == []  # the creating record was written durably by write_atomic; the rename is not flushed
    agent.create_volume("ds", MiB, VolumeParameters.parse({"dataset.path": "/datasets/x"}), {})
    assert flushed == [tmp_path / "state" / "volumes"]


def test_any_fill_failure_removes_the_half_made_volume(tmp_path: Path) -> None:
    """Before, only domain errors cleaned up: a bug in the filler left the record, the file and configfs behind."""
    filler = BrokenFiller()
    agent = make_agent(tmp_path)
    agent = TargetAgent(agent.name, agent.nvmet, agent.store, agent.state, agent.portals, filler=filler)
    agent.converge()
    with pytest.raises(RuntimeError):
        agent.create_volume("ds", MiB, VolumeParameters.parse({"dataset.path": "/datasets/x"}), {})
    assert dict(agent.state.current.volumes) == {} and agent.store.files() == [] and agent.nvmet.subsystems() == []
    assert len(filler.discarded) == 1
    assert filler.released == ["/datasets/x"]  # before: the data set stayed held (pinned) forever


RESERVED = "5d0c9a1e-8f53-4b39-a3a2-0d9f7e0b1c01"


def test_a_create_with_a_reserved_uuid_makes_that_volume_and_a_repeat_returns_it(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    made = agent.create_volume("pvc-r", MiB, VolumeParameters.parse({}), {}, vol_uuid=RESERVED).record
    assert made.uuid == RESERVED and agent.nvmet.has_subsystem(volume_nqn(RESERVED))
    assert agent.create_volume("pvc-r", MiB, VolumeParameters.parse({}), {}, vol_uuid=RESERVED).record == made
    assert agent.create_volume("pvc-r", MiB, VolumeParameters.parse({}), {}).record == made  # by name alone, as before


def test_a_name_held_under_another_uuid_or_a_uuid_held_by_another_name_is_refused(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    held = agent.create_volume("pvc-a", MiB, VolumeParameters.parse({}), {}).record
    with pytest.raises(AlreadyExists, match="not as the reserved"):
        agent.create_volume("pvc-a", MiB, VolumeParameters.parse({}), {}, vol_uuid=RESERVED)
    with pytest.raises(AlreadyExists, match="is taken"):
        agent.create_volume("pvc-b", MiB, VolumeParameters.parse({}), {}, vol_uuid=held.uuid)
    assert [v.record.uuid for v in agent.list_volumes()] == [held.uuid]


def test_lookup_name_reports_a_reservation_else_a_volume_of_that_name(tmp_path: Path) -> None:
    from nvmeof_csi.agent.names import Reservation

    agent = make_agent(tmp_path)
    agent.converge()
    assert agent.lookup_name("pvc-x") is None
    old = agent.create_volume("pvc-x", MiB, VolumeParameters.parse({}), {}).record  # made before reservations
    assert agent.lookup_name("pvc-x") == Reservation("pvc-x", old.uuid, "")
    kept = agent.reserve_name(Reservation("pvc-x", old.uuid, "store-a"))
    assert agent.lookup_name("pvc-x") == kept == Reservation("pvc-x", old.uuid, "store-a")
