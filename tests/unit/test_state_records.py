"""agent/state.py: one file per record, only changed records written, status changes as renames, concurrent
commits of different records all kept, older one-document state migrated."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvmeof_csi.agent import state as state_module
from nvmeof_csi.agent.state import DELETING, READY, SnapshotRecord, StateStore, VolumeRecord
from nvmeof_csi.agent.state_model import Delta
from nvmeof_csi.errors import DriverError

A = "0b4a8a52-6d0e-4c39-9a43-6f2d1f6c0a01"
B = "0b4a8a52-6d0e-4c39-9a43-6f2d1f6c0a02"


def test_a_commit_writes_only_the_record_it_changed(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.put_volume(VolumeRecord(A, "a", 1 << 20, hosts={"nqn.h": "secret"}, status=READY))
    store.put_volume(VolumeRecord(B, "b", 1 << 20))  # creating
    a_file, b_creating = tmp_path / "volumes" / f"{A}.json", tmp_path / "volumes" / f"{B}.creating.json"
    inode, b_inode = a_file.stat().st_ino, b_creating.stat().st_ino
    store.put_volume(store.current.volumes[B].evolve(status=READY))
    assert a_file.stat().st_ino == inode  # A's record was not rewritten
    b_ready = tmp_path / "volumes" / f"{B}.json"
    assert not b_creating.exists() and b_ready.stat().st_ino == b_inode  # a status change is a rename
    assert json.loads(b_ready.read_text())["name"] == "b"
    assert oct(a_file.stat().st_mode & 0o777) == "0o600"
    store.put_volume(store.current.volumes[B].evolve(status=DELETING, capacity_bytes=2 << 20))  # both change
    assert sorted(p.name for p in (tmp_path / "volumes").iterdir()) == [f"{A}.json", f"{B}.deleting.json"]
    store.drop_volume(A)
    assert not a_file.exists()
    again = StateStore(tmp_path).current
    assert set(again.volumes) == {B} and again.volumes[B].status == DELETING
    assert again.volumes[B].capacity_bytes == 2 << 20


def test_everything_survives_a_reload(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    vol = store.put_volume(
        VolumeRecord(
            A, "a", 4096, parameters={"p": "1"}, readonly_hosts=("nqn.r",), ctrl_keys={"nqn.r": "k"}, created_at=12.5
        )
    )
    snap = store.put_snapshot(SnapshotRecord(B, "s", A, 4096, status=READY))
    store.put_ana("a", "inaccessible")
    again = StateStore(tmp_path).current
    assert again.volumes[A] == vol and again.snapshots[B] == snap and again.ana == {"a": "inaccessible"}


def test_an_older_one_document_state_is_split_into_records(tmp_path: Path) -> None:
    legacy = {
        "version": 1,
        "ana": {"a": "optimized"},
        "snapshots": {},
        "volumes": {
            A: {
                "uuid": A,
                "name": "a",
                "capacity_bytes": 4096,
                "parameters": {},
                "labels": {},
                "hosts": {},
                "ctrl_keys": {},
                "readonly_hosts": [],
                "source_volume": "",
                "source_snapshot": "",
                "status": "ready",
                "created_at": 1.0,
            }
        },
    }
    (tmp_path / "agent-state.json").write_text(json.dumps(legacy))
    state = StateStore(tmp_path).current
    assert state.volumes[A].name == "a" and state.volumes[A].readonly_hosts == () and state.ana == {"a": "optimized"}
    assert not (tmp_path / "agent-state.json").exists() and (tmp_path / "volumes" / f"{A}.json").exists()
    assert StateStore(tmp_path).current == state


def test_concurrent_commits_of_different_records_are_all_kept(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    uuids = [f"0b4a8a52-6d0e-4c39-9a43-6f2d1f6c{i:04x}" for i in range(16)]

    def cycle(vol: str) -> None:
        rec = store.put_volume(VolumeRecord(vol, vol[-4:], 4096))
        store.put_volume(rec.evolve(status=READY))

    threads = [threading.Thread(target=cycle, args=(u,)) for u in uuids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(store.current.volumes) == uuids
    assert {v.status for v in store.current.volumes.values()} == {READY}
    assert StateStore(tmp_path).current == store.current


def test_unreadable_or_misnamed_records_stop_the_load_and_temp_files_are_swept(tmp_path: Path) -> None:
    StateStore(tmp_path).put_volume(VolumeRecord(A, "a", 4096, status=READY))
    (tmp_path / "volumes" / f".{B}.json.x1y2").write_text("{half")  # an interrupted write
    assert set(StateStore(tmp_path).current.volumes) == {A}
    assert not (tmp_path / "volumes" / f".{B}.json.x1y2").exists()
    twice = tmp_path / "volumes" / f"{A}.deleting.json"
    twice.write_bytes((tmp_path / "volumes" / f"{A}.json").read_bytes())
    with pytest.raises(DriverError, match="saved twice"):
        StateStore(tmp_path)
    twice.unlink()
    (tmp_path / "volumes" / f"{A}.json").rename(tmp_path / "volumes" / f"{A}.gone.json")
    with pytest.raises(DriverError, match="misnamed"):
        StateStore(tmp_path)
    (tmp_path / "volumes" / f"{A}.gone.json").rename(tmp_path / "volumes" / f"{B}.json")
    with pytest.raises(DriverError, match="misnamed"):
        StateStore(tmp_path)
    (tmp_path / "volumes" / f"{B}.json").write_text("{not json")
    with pytest.raises(DriverError, match="unreadable"):
        StateStore(tmp_path)


def test_only_the_removal_of_a_deleting_record_skips_the_folder_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.put_volume(VolumeRecord(A, "a", 1 << 20))  # creating: a failed create drops it
    store.put_volume(VolumeRecord(B, "b", 1 << 20, status=DELETING))
    flushed: list[Path] = []
    monkeypatch.setattr(state_module, "fsync_dir", flushed.append)
    store.drop_volume(B)  # a lost unlink brings back a deleting record: the agent's start finishes that delete
    assert flushed == [] and not (tmp_path / "volumes" / f"{B}.deleting.json").exists()
    store.drop_volume(A)  # a lost unlink would bring back a volume whose create was refused: flushed
    assert flushed == [tmp_path / "volumes"]


def test_a_rename_is_flushed_unless_the_caller_says_losing_it_is_harmless(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.put_volume(VolumeRecord(A, "a", 1 << 20))
    store.put_volume(VolumeRecord(B, "b", 1 << 20))
    flushed: list[Path] = []
    monkeypatch.setattr(state_module, "fsync_dir", flushed.append)
    store.put_volume(store.current.volumes[A].evolve(status=READY), flush_renames=False)
    assert flushed == [] and (tmp_path / "volumes" / f"{A}.json").exists()
    store.put_volume(store.current.volumes[B].evolve(status=READY))
    assert flushed == [tmp_path / "volumes"]


def _blocked_persist(monkeypatch: pytest.MonkeyPatch, release: threading.Event, entered: threading.Event) -> None:
    """Commits of a volume named "slow" stop in their file work until ``release`` is set."""
    real = StateStore._persist

    def persist(self: StateStore, delta: Delta, flush_renames: bool = True) -> None:
        if any(new.name == "slow" for _, new in delta.put["volumes"].values()):
            entered.set()
            assert release.wait(10)
        real(self, delta, flush_renames)

    monkeypatch.setattr(StateStore, "_persist", persist)


def test_a_record_becomes_current_only_once_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader of ``current`` never sees a record whose files are still being written (and never waits)."""
    store = StateStore(tmp_path)
    release, entered = threading.Event(), threading.Event()
    _blocked_persist(monkeypatch, release, entered)
    writer = threading.Thread(target=store.put_volume, args=(VolumeRecord(A, "slow", 4096, created_at=1.0),))
    writer.start()
    assert entered.wait(10)
    assert A not in store.current.volumes  # not visible while its files are written
    release.set()
    writer.join(10)
    assert A in store.current.volumes


def test_a_failed_commit_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path)

    def broken(self: StateStore, delta: Delta, flush_renames: bool = True) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(StateStore, "_persist", broken)
    with pytest.raises(OSError, match="disk full"):
        store.put_volume(VolumeRecord(A, "slow", 4096))
    assert dict(store.current.volumes) == {}


def test_the_time_floor_of_an_older_agent_is_removed_on_load(tmp_path: Path) -> None:
    """Agents before name reservations kept a clock floor; it means nothing now and must not linger."""
    (tmp_path / "time-floor.json").write_text('{"floor": 5000.0}\n')
    StateStore(tmp_path).put_volume(VolumeRecord(A, "a", 4096, status=READY))
    assert not (tmp_path / "time-floor.json").exists()
    assert set(StateStore(tmp_path).current.volumes) == {A}


@settings(max_examples=60, deadline=None)
@given(
    start=st.sets(st.integers(0, 40)),
    put=st.sets(st.integers(0, 60)),
    gone=st.sets(st.integers(0, 60)),
)
def test_a_change_onto_a_state_is_the_records_a_copy_would_hold_and_leaves_the_old_state_as_it_was(
    start: set[int], put: set[int], gone: set[int]
) -> None:
    """The state's records are an immutable map, so a commit costs its change, not every record: what it makes
    must still equal what copying every record and changing the copy makes, and a reader's old state keeps its
    records."""
    from immutables import Map

    from nvmeof_csi.agent.state_model import AgentState

    def uid(i: int) -> str:
        return f"00000000-0000-4000-8000-{i:012d}"

    old = AgentState(volumes=Map({uid(i): VolumeRecord(uid(i), f"v{i}", 4096) for i in start}))
    seen = dict(old.volumes)
    state = old
    for i in sorted(put - gone):
        state = Delta.of_record("volumes", state.volumes.get(uid(i)), VolumeRecord(uid(i), f"n{i}", 8192)).onto(state)
    for i in sorted(gone):
        state = Delta.of_record("volumes", state.volumes.get(uid(i)), None).onto(state)
    expected = {k: v for k, v in seen.items() if int(k[-12:]) not in gone}
    expected.update({uid(i): VolumeRecord(uid(i), f"n{i}", 8192) for i in put - gone})
    assert dict(state.volumes) == expected and isinstance(state.volumes, Map)
    assert dict(old.volumes) == seen  # the old state, as a reader holding it sees it
    assert state.snapshots is old.snapshots  # a kind the change does not touch is shared
