"""``nvmeofctl volumes show`` of a replicated volume: each replica's role, DRBD's view and sync progress in one
line (the agent's message, never its secret: the message has no field for it)."""

from __future__ import annotations

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
