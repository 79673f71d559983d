"""One staging record that parses but holds a context the real NVMe-oF connector cannot use (a record another
writer or a half-upgraded node left) is set aside at start-up while every other record is reconciled, the QoS pass
goes on past a volume it cannot serve, and NodeGetStorageHealth names what was set aside. Before, such a record
made start-up reconciliation raise (the node plugin crash-looped, every volume on the node down)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.service.records import AccessSpec, StagingRecord, StagingStore
from nvmeof_csi.service.staging import StagingService
from tests.support.fakes import FakeHost
from tests.unit.test_connector import OTHER, VOL, connector, ctx


def service(tmp: Path) -> tuple[StagingService, StagingStore]:
    conn, _ = connector(tmp)
    store = StagingStore(tmp / "records")
    host = FakeHost(tmp / "mountinfo")
    return StagingService(conn, Mounter(host, tmp / "mountinfo"), Filesystems(host), store, root=tmp), store


def record(ref_uuid: str, context: dict[str, str]) -> StagingRecord:
    from nvmeof_csi.service.contracts import VolumeRef

    ref = VolumeRef(VOL.location, ref_uuid)
    return StagingRecord(f"nvmeof-v1.{ref.location}.{ref.uuid}", ref, "/s", AccessSpec(block=True), context)


def test_a_record_with_an_unusable_context_is_quarantined_and_the_rest_reconciled(tmp_path: Path) -> None:
    svc, store = service(tmp_path)
    store.save(record(VOL.uuid, ctx(VOL)))
    bad = ctx(OTHER)
    bad["nqn"] = "nqn.2014-08.org.example:not-this-volume"  # valid JSON, valid NQN, wrong volume
    store.save(record(OTHER.uuid, bad))
    actions = svc.reconcile(30)  # before: InvalidArgument out of here
    assert any(a.startswith(f"volume {OTHER.uuid}: staging record quarantined") for a in actions), actions
    assert f"volume {VOL.uuid}: reconnected tcp:127.0.0.1:4420, tcp:127.0.0.2:4421" in actions
    assert [r.ref.uuid for r in store.all()] == [VOL.uuid]
    aside = svc.quarantined_records()
    assert len(aside) == 1 and OTHER.uuid in aside[0]
    assert json.loads((tmp_path / "records" / aside[0]).read_text())["context"]["nqn"] == bad["nqn"]  # kept aside


def test_the_qos_pass_goes_on_past_a_volume_it_cannot_serve(tmp_path: Path) -> None:
    class Exploding:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def reconcile(self, records: list[StagingRecord]) -> list[str]:
            self.seen += [r.volume_id for r in records]
            if records[0].ref.uuid == VOL.uuid:
                raise ValueError("io.max: garbage")
            return ["ok"]

        def refresh(self, record: StagingRecord, source: object) -> list[str]:
            return []

    conn, _ = connector(tmp_path)
    store = StagingStore(tmp_path / "records")
    host = FakeHost(tmp_path / "mountinfo")
    qos = Exploding()
    svc = StagingService(
        conn,
        Mounter(host, tmp_path / "mountinfo"),
        Filesystems(host),
        store,
        root=tmp_path,
        qos=qos,  # type: ignore[arg-type]
    )
    store.save(record(VOL.uuid, ctx(VOL)))
    store.save(record(OTHER.uuid, ctx(OTHER)))
    actions = svc.reconcile_limits()  # before: the ValueError ended the pass for every volume
    assert len(qos.seen) == 2 and "ok" in actions
    assert any("skipped (io.max: garbage)" in a for a in actions), actions


def test_the_stores_refs_come_from_file_names_and_count_an_unreadable_record(tmp_path: Path) -> None:
    """An unstage asks which other volumes are staged (a shared subsystem stays connected): from the names, so
    it reads one record and not all of them; a record that does not parse still counts as staged."""
    from nvmeof_csi.service.contracts import VolumeRef

    store = StagingStore(tmp_path / "records")
    assert store.refs() == frozenset()
    store.save(record(VOL.uuid, ctx(VOL)))
    dotted = VolumeRef("agent.rack-2.example", OTHER.uuid)  # a location with dots
    store.save(StagingRecord("v", dotted, "/s", AccessSpec(block=True), ctx(OTHER)))
    broken = VolumeRef(VOL.location, "3f1e9a52-8d77-4c1b-9a55-5b0f2c9d1e01")
    (tmp_path / "records" / f"{broken.location}.{broken.uuid}.json").write_text("{not json")
    (tmp_path / "records" / "x.json.corrupt-17").write_text("")  # set aside: no longer a record
    (tmp_path / "records" / f".{VOL.location}.{VOL.uuid}.json.1-2.tmp").write_text("")  # a writer's temp file
    assert store.refs() == {VOL, dotted, broken}
    assert {r.ref for r in store.all()} == {VOL, dotted}  # all() reads and sets the broken one aside


def test_unstage_of_a_volume_whose_record_was_set_aside_goes_by_its_id(tmp_path: Path) -> None:
    """Before, NodeUnstage of a volume whose record was quarantined was a silent success: its connections (and a
    staging mount) stayed, and the volume could be staged on another node while this one still held it."""
    busy: dict[str, str] = {}
    conn, _ = connector(tmp_path, busy=busy)
    store = StagingStore(tmp_path / "records")
    host = FakeHost(tmp_path / "mountinfo")
    svc = StagingService(conn, Mounter(host, tmp_path / "mountinfo"), Filesystems(host), store, root=tmp_path)
    device = conn.connect(OTHER, ctx(OTHER), 30)
    bad = ctx(OTHER)
    bad["nqn"] = "nqn.2014-08.org.example:not-this-volume"
    store.save(record(OTHER.uuid, bad))
    store.quarantine(OTHER, ValueError("unusable context"))
    staging = str(tmp_path / "staging" / "globalmount")
    busy[device] = "mounted at a pod's target"
    with pytest.raises(FailedPrecondition, match="kept"):  # published still: never pulled from under a pod
        svc.unstage(OTHER, staging)
    assert conn.find_device(OTHER, ctx(OTHER)) == device
    busy.clear()
    svc.unstage(OTHER, staging)
    assert conn.find_device(OTHER, ctx(OTHER)) is None  # disconnected by the volume ID
    assert svc.quarantined_records(), "the set-aside record stays for the operator"
    svc.unstage(OTHER, staging)  # repeated: nothing left, still success
