"""agent/names.py: one atomic reservation per name, kept against every racer; lookups that only read; releases
that never remove a newer reservation; hostile names that never reach a path."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from nvmeof_csi.agent.names import NameBook, Reservation
from nvmeof_csi.errors import DriverError, InvalidArgument

U1 = "7a1d0c52-1f0e-4c39-9a43-6f2d1f6c0a01"
U2 = "7a1d0c52-1f0e-4c39-9a43-6f2d1f6c0a02"


def test_of_many_racing_reservations_exactly_one_is_kept_and_every_racer_gets_it(tmp_path: Path) -> None:
    books = [NameBook(tmp_path) for _ in range(2)]  # two books on one folder: no shared in-process lock
    wanted = [Reservation("pvc-race", f"7a1d0c52-1f0e-4c39-9a43-{i:012x}", f"store-{i % 3}") for i in range(16)]
    start = threading.Barrier(len(wanted))
    got: list[Reservation] = []

    def racer(i: int) -> None:
        start.wait(10)
        got.append(books[i % 2].reserve(wanted[i]))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(len(wanted))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == len(wanted) and len(set(got)) == 1 and got[0] in wanted
    assert NameBook(tmp_path).lookup("pvc-race") == got[0]
    assert [p.name for p in (tmp_path / "names").iterdir()] == [f"{_digest('pvc-race')}.json"]  # no temp left


def _digest(name: str) -> str:
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()


def test_a_release_removes_only_the_reservation_of_its_uuid(tmp_path: Path) -> None:
    book = NameBook(tmp_path)
    book.reserve(Reservation("pvc-1", U1, "store-a"))
    book.release("pvc-1", U2)  # late release of another UUID: the reservation stays
    assert book.lookup("pvc-1") == Reservation("pvc-1", U1, "store-a")
    book.release("pvc-1", U1)
    assert book.lookup("pvc-1") is None
    book.release("pvc-1", U1)  # absent: success
    assert book.reserve(Reservation("pvc-1", U2, "store-b")).volume_uuid == U2


@pytest.mark.parametrize("name", ["../../etc/passwd", "/abs", "a/b", "..", "x" * 256, "\u202e\u0000nul"])
def test_a_hostile_name_is_kept_under_the_folder_by_its_digest(tmp_path: Path, name: str) -> None:
    book = NameBook(tmp_path / "state")
    book.reserve(Reservation(name, U1, "store-a"))
    (only,) = (tmp_path / "state" / "names").iterdir()
    assert only.name == f"{_digest(name)}.json" and book.lookup(name) == Reservation(name, U1, "store-a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


@pytest.mark.parametrize(
    ("wanted", "needle"),
    [
        (Reservation("", U1, "store-a"), "name"),
        (Reservation("x" * 257, U1, "store-a"), "name"),
        (Reservation("pvc", "not-a-uuid", "store-a"), "volume_uuid"),
        (Reservation("pvc", U1.upper(), "store-a"), "canonical"),
        (Reservation("pvc", U1, ""), "agent"),
        (Reservation("pvc", U1, "store\n-a"), "agent"),
    ],
)
def test_a_malformed_reservation_is_refused_before_anything_is_written(
    tmp_path: Path,
    wanted: Reservation,
    needle: str,
) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        NameBook(tmp_path).reserve(wanted)
    assert not (tmp_path / "names").exists()


@pytest.mark.parametrize(
    "doc",
    [
        "{half",
        "[]",
        {"version": 2, "name": "pvc", "volume_uuid": U1, "agent": "a"},
        {"version": 1, "name": "pvc", "volume_uuid": "x", "agent": "a"},
        {"version": 1, "name": "other", "volume_uuid": U1, "agent": "a"},
        {"version": 1, "name": "pvc", "agent": "a"},
    ],
)
def test_an_unreadable_or_foreign_reservation_stops_the_lookup(tmp_path: Path, doc: object) -> None:
    (tmp_path / "names").mkdir()
    (tmp_path / "names" / f"{_digest('pvc')}.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(DriverError, match="name reservation"):
        NameBook(tmp_path).lookup("pvc")


def test_a_kept_reservation_is_what_the_file_says(tmp_path: Path) -> None:
    NameBook(tmp_path).reserve(Reservation("pvc", U1, "store-a"))
    doc = json.loads((tmp_path / "names" / f"{_digest('pvc')}.json").read_text())
    assert doc == {"version": 1, "name": "pvc", "volume_uuid": U1, "agent": "store-a"}
    assert (tmp_path / "names" / f"{_digest('pvc')}.json").stat().st_mode & 0o777 == 0o600
