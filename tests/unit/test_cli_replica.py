"""``nvmeofctl volumes show`` of a replicated volume: each replica's role, DRBD's view and sync progress in one
line (the agent's message, never its secret: the message has no field for it); ``nvmeofctl storage drain
--wait`` following a node's volumes until it is primary for none."""

from __future__ import annotations

from pathlib import Path

from nvmeof_csi.agent.drain import DrainMark
from nvmeof_csi.cli.storage import follow
from nvmeof_csi.cli.volumes import _row
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb


def test_a_replica_shows_its_role_drbd_state_sync_progress_and_peer() -> None:
    replica = pb.Replica(peer_agent="store-b", role="primary", epoch=3, drbd_role="Primary", disk="UpToDate",
                         peer_disk="Inconsistent", connection="SyncSource", synced_percent=43.2,
                         out_of_sync_bytes=12 << 20, minor=100, port=7800)  # fmt: skip
    row = _row("store-a", pb.Volume(uuid="u", capacity_bytes=1 << 30, replica=replica))
    assert row["replica_state"] == (
        "primary (epoch 3); DRBD Primary UpToDate/Inconsistent SyncSource, 43% synced, 12.0 MiB to copy; peer store-b"
    )
    assert "replica_state" not in _row("store-a", pb.Volume(uuid="u", capacity_bytes=1 << 30))
    down = _row("store-b", pb.Volume(uuid="u", replica=pb.Replica(peer_agent="store-a", role="secondary")))
    assert down["replica_state"] == "secondary (epoch 0); DRBD not up; peer store-a"


def _vols(*roles: str) -> list[pb.Volume]:
    return [pb.Volume(uuid=f"v{i}", replica=pb.Replica(role=r, peer_agent="store-b")) for i, r in enumerate(roles)]


def test_drain_follows_the_moves_until_nothing_is_primary_here_or_the_time_runs_out() -> None:
    listings = iter([_vols("primary", "primary", "secondary"), _vols("secondary", "primary"), _vols("secondary")])
    said: list[str] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    left = follow(lambda: next(listings), 60, said.append, sleep, lambda: clock[0])
    assert left == {} and said == [f"{n} replicated volume(s) still primary here" for n in (2, 1, 0)]
    stuck = follow(lambda: [*_vols("primary"), pb.Volume(uuid="plain")], 3, said.append, sleep, lambda: clock[0])
    assert list(stuck) == ["v0"] and stuck["v0"].startswith("primary (epoch 0)")


def test_drain_refuses_a_wait_that_is_not_a_finite_number_of_seconds() -> None:
    from typer.testing import CliRunner

    from nvmeof_csi.cli.main import app

    for bad in ("nan", "inf", "-1"):
        result = CliRunner().invoke(
            app, ["--agent", "unix:///nowhere.sock", "storage", "drain", "agent", "--wait", bad]
        )
        assert result.exit_code == 2 and "--wait" in result.output, (bad, result.output)


def test_an_unreadable_drain_mark_is_not_draining_and_health_still_answers(tmp_path: Path) -> None:
    (tmp_path / "drain.json").write_text("{not json")
    assert DrainMark(tmp_path).draining() is False
    DrainMark(tmp_path).set(True)
    assert DrainMark(tmp_path).draining() is True
