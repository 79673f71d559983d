"""The arbiter's record of a replicated volume in the Kubernetes API (``kube/replica_records.py``): it survives a
round trip, two writers deciding on one version never both win, and a record that cannot be read stops the
volume with its name rather than a guess."""

from __future__ import annotations

import pytest

from nvmeof_csi.errors import AlreadyExists, FailedPrecondition, InvalidArgument, Unavailable
from nvmeof_csi.kube.replica_records import PREFIX, ReplicaRecords
from nvmeof_csi.service.arbiter import UP_TO_DATE, ReplicaRecord, failover, fence_peer
from tests.support.leases import Leases

VOL = "5d0c9a1e-8f53-4b39-a3a2-0d9f7e0b1c01"
FIRST = ReplicaRecord(("storage-1", "storage-2"), primary="storage-1")


def test_a_record_round_trips_and_absent_is_none() -> None:
    leases = Leases()
    records = ReplicaRecords(leases, "nvmeof-csi")
    assert records.read(VOL) is None
    records.create(VOL, FIRST)
    with pytest.raises(AlreadyExists):
        records.create(VOL, FIRST)
    outdated = fence_peer(FIRST, "storage-1", 1).record
    record, version = records.read(VOL)  # type: ignore[misc]
    assert record == FIRST and records.replace(VOL, outdated, version)
    assert records.read(VOL) == (outdated, "2")
    leases.leases["nvmeof-csi-identity-signer"] = ({"spec": {}, "metadata": {}}, 1)  # another Lease: not listed
    assert records.volumes() == [VOL]
    records.delete(VOL)
    records.delete(VOL)  # absent: success
    assert records.read(VOL) is None and records.volumes() == []
    with pytest.raises(InvalidArgument):
        records.read("../../etc")


def test_two_deciders_on_one_version_never_both_win() -> None:
    records = ReplicaRecords(Leases(), "nvmeof-csi")
    records.create(VOL, FIRST)
    seen, version = records.read(VOL)  # type: ignore[misc]
    promoted = failover(seen, primary_lease_expired=True, candidate_disk=UP_TO_DATE).record
    fenced = fence_peer(seen, "storage-1", 1).record  # the old primary's handler, deciding on the same read
    assert records.replace(VOL, promoted, version) is True
    assert records.replace(VOL, fenced, version) is False  # it must read again, and is then refused
    fresh, _ = records.read(VOL)  # type: ignore[misc]
    assert fresh.primary == "storage-2" and not fence_peer(fresh, "storage-1", 1).allowed


def test_an_unreadable_record_stops_the_volume_and_an_unreachable_api_is_unavailable() -> None:
    api = Leases()
    records = ReplicaRecords(api, "nvmeof-csi")
    records.create(VOL, FIRST)
    api.leases[PREFIX + VOL][0]["metadata"]["annotations"]["replica.csi.nvmeof.io/epoch"] = "many"
    with pytest.raises(FailedPrecondition, match=f"replica record {PREFIX}{VOL} cannot be read"):
        records.read(VOL)
    api.leases[PREFIX + VOL][0]["spec"]["holderIdentity"] = "storage-9"
    api.leases[PREFIX + VOL][0]["metadata"]["annotations"]["replica.csi.nvmeof.io/epoch"] = "3"
    with pytest.raises(FailedPrecondition, match="do not fit together"):
        records.read(VOL)
    api.down = True
    with pytest.raises(Unavailable, match="HTTP 503"):
        records.read(VOL)
