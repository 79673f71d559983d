"""Replicated volumes made, found, published and removed by the controller's backend (``fleet/pairs.py``):
two real agents on plain configfs trees, each with a stand-in kernel under its replica
(``tests/support/drbd_kernel.py``), the arbiter's records on a stand-in Lease API."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.agent.replicas import metadata_bytes
from nvmeof_csi.errors import FailedPrecondition, Unavailable
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.kube.replica_records import ReplicaRecords
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from tests.support.agents import PORTALS, LocalAgent
from tests.support.drbd_kernel import Kernel, replicated_agent
from tests.support.leases import Leases

MiB = 1 << 20
TWO = VolumeParameters.parse({"replicas": "2"})
HOST = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
NODES = {"store-a": ("storage-1", "10.0.1.2"), "store-b": ("storage-2", "10.0.1.3")}


class Fleet:
    def __init__(self, tmp: Path, records: bool = True) -> None:
        self.kernels = {name: Kernel() for name in NODES}
        for kernel in self.kernels.values():
            kernel.number = 100  # the first slot's minor
        self.agents = {
            name: LocalAgent(replicated_agent(tmp / name, self.kernels[name], name, host, address), free=1 << 30)
            for name, (host, address) in NODES.items()
        }
        self.leases = Leases()
        entries = tuple(AgentEntry(n, Endpoint.parse(f"unix:///{n}.sock"), "f1", node=NODES[n][0]) for n in NODES)
        self.now = 0.0
        self.backend = AgentBackend(
            FabricMap(entries),
            lambda e: self.agents[e.name],
            sleep=self.sleep,
            clock=lambda: self.now,
            records=ReplicaRecords(self.leases, "nvmeof-csi") if records else None,
        )

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def replica(self, agent: str, vol: str) -> dict[str, str]:
        return dict(self.agents[agent].agent.get_volume(vol).record.replica)


def test_a_replicated_volume_is_two_replicas_one_record_and_the_first_primary(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    vol = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    first = vol.ref.location
    second = "store-b" if first == "store-a" else "store-a"
    one, two = fleet.replica(first, vol.ref.uuid), fleet.replica(second, vol.ref.uuid)
    assert (one["peer_agent"], two["peer_agent"]) == (second, first)
    assert (one["minor"], one["port"]) == (two["minor"], two["port"]) == ("100", "7800")
    assert one["secret"] == two["secret"] and len(one["secret"]) == 32
    assert (one["address"], one["peer_address"]) == (two["peer_address"], two["address"])
    assert (one["role"], one["epoch"], two["role"]) == ("primary", "1", "secondary")
    assert vol.ready and vol.parameters.replicas == 2
    assert len(vol.context["portals"].split(",")) == 2 * len(PORTALS)  # both agents' portals: one head
    record = ReplicaRecords(fleet.leases, "nvmeof-csi").read(vol.ref.uuid)
    assert record is not None and (record[0].primary, record[0].epoch) == (first, 1)
    assert [v.ref for v in fleet.backend.list_volumes()] == [vol.ref]  # once, as its first replica
    again = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    assert again.ref == vol.ref and fleet.replica(first, vol.ref.uuid)["secret"] == one["secret"]
    for kernel in fleet.kernels.values():
        kernel.number = 101  # the stand-in models one minor: the next volume's
    other = fleet.backend.create_volume("pvc-s", 64 * MiB, TWO)
    assert fleet.replica(other.ref.location, other.ref.uuid)["minor"] == "101"  # the next slot free on both


def test_publish_and_delete_reach_both_replicas(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    vol = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    fleet.backend.publish(vol.ref, HOST, readonly=False)
    for agent in fleet.agents.values():
        assert HOST in agent.agent.get_volume(vol.ref.uuid).record.hosts
    fleet.backend.unpublish(vol.ref, HOST)
    assert all(not a.agent.get_volume(vol.ref.uuid).record.hosts for a in fleet.agents.values())
    fleet.backend.delete_volume(vol.ref)
    assert all(not a.list_volumes() for a in fleet.agents.values())
    assert ReplicaRecords(fleet.leases, "nvmeof-csi").read(vol.ref.uuid) is None
    assert fleet.backend.get_volume(vol.ref) is None


def test_a_delete_cut_short_after_the_first_replica_went_is_finished_by_its_retry(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    vol = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    fleet.agents[vol.ref.location].agent.delete_volume(vol.ref.uuid)  # the first went, then the controller died
    fleet.backend.delete_volume(vol.ref)  # the provisioner's retry
    assert all(not a.list_volumes() for a in fleet.agents.values())  # the peer's replica too
    assert ReplicaRecords(fleet.leases, "nvmeof-csi").read(vol.ref.uuid) is None


def test_an_agent_that_names_another_peer_than_the_record_is_not_believed(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    vol = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    records = ReplicaRecords(fleet.leases, "nvmeof-csi")
    found = records.read(vol.ref.uuid)
    assert found is not None
    record, version = found
    peer = record.peer(vol.ref.location)
    assert records.replace(vol.ref.uuid, replace(record, replicas=(vol.ref.location, "store-z")), version)
    with pytest.raises(FailedPrecondition, match=f"names '{peer}' as its other replica, the .* record names 'store-z'"):
        fleet.backend.publish(vol.ref, HOST, readonly=False)
    assert HOST not in fleet.agents[peer].agent.get_volume(vol.ref.uuid).record.hosts


def test_a_half_made_pair_is_made_again_with_a_fresh_secret(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    calls = {"n": 0}

    def crash_on_the_second() -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise Unavailable("the controller died here")

    for agent in fleet.agents.values():
        agent.before_create = crash_on_the_second
    with pytest.raises(Unavailable):
        fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    made = [n for n, a in fleet.agents.items() if a.list_volumes()]
    assert len(made) == 1
    lone = fleet.agents[made[0]].list_volumes()[0]
    before = fleet.replica(made[0], lone.uuid)["secret"]
    vol = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    assert vol.ref.uuid == lone.uuid and vol.ready
    secrets = {fleet.replica(n, vol.ref.uuid)["secret"] for n in fleet.agents}
    assert len(secrets) == 1 and before not in secrets


def test_what_a_replicated_create_refuses(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="replica records"):
        Fleet(tmp_path / "norecords", records=False).backend.create_volume("pvc-r", 64 * MiB, TWO)
    fleet = Fleet(tmp_path / "apart")
    for kernel in fleet.kernels.values():
        kernel.link = "WFConnection"  # the replication link down: the replicas never connect
    with pytest.raises(Unavailable, match="did not connect"):
        fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    assert not fleet.leases.leases  # no record: the pair was never handed out


def test_a_pairs_condition_comes_from_both_replicas(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    vol = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    first = vol.ref.location
    second = "store-b" if first == "store-a" else "store-a"
    assert fleet.backend.condition(vol.ref).abnormal is False
    fleet.kernels[first].minor = {**(fleet.kernels[first].minor or {}), "cs": "WFConnection", "pds": "DUnknown"}
    seen = fleet.backend.condition(vol.ref)
    assert [(p.status, p.reason) for p in seen.problems] == [("degraded", "ReplicaNotInSync")]
    assert seen.message.startswith(f"replica on {first}: 1 of 2 replicas in sync")

    def unreachable() -> pb.HealthResponse:
        raise Unavailable("connection refused")

    fleet.agents[second].health = unreachable  # type: ignore[method-assign]
    seen = fleet.backend.condition(vol.ref)  # the primary serves: the lost replica degrades the volume
    assert ("degraded", "AgentUnreachable") in [(p.status, p.reason) for p in seen.problems]
    fleet.agents[first].health = unreachable  # type: ignore[method-assign]
    seen = fleet.backend.condition(vol.ref)  # the peer found from the record; nobody serves
    assert [(p.status, p.reason) for p in seen.problems] == [("inaccessible", "AgentUnreachable")] * 2


def test_a_replicated_volume_grows_its_secondary_first_and_only_while_its_primary_is_connected(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    vol = fleet.backend.create_volume("pvc-r", 64 * MiB, TWO)
    first = vol.ref.location
    second = "store-b" if first == "store-a" else "store-a"
    order: list[str] = []
    for name, local in fleet.agents.items():
        real = local.resize_volume

        def resize(vol_uuid: str, capacity_bytes: int, name: str = name, real: Any = real) -> pb.Volume:
            order.append(name)
            return real(vol_uuid, capacity_bytes)  # type: ignore[no-any-return]

        local.resize_volume = resize  # type: ignore[method-assign]

    def sizes() -> dict[str, int]:
        return {n: a.agent.store.volume_path(vol.ref.uuid).stat().st_size for n, a in fleet.agents.items()}

    primary = fleet.kernels[first].minor
    assert primary is not None
    primary["cs"] = "WFConnection"  # the replication link down: drbdadm resize would need both grown and connected
    before = sizes()
    with pytest.raises(
        FailedPrecondition, match=f"grows only while both replicas are connected; its Primary on {first}"
    ):
        fleet.backend.expand_volume(vol.ref, 96 * MiB)
    assert sizes() == before and order == []  # nothing grown
    primary["cs"] = "Connected"
    assert fleet.backend.expand_volume(vol.ref, 96 * MiB) == 96 * MiB
    assert order == [second, first]  # the Secondary's file first: DRBD grows to the smaller backing device
    assert set(sizes().values()) == {96 * MiB + metadata_bytes(96 * MiB)}
    assert fleet.kernels[first].words().count("resize") == 1 and "resize" not in fleet.kernels[second].words()
    primary["ro"] = "Secondary"  # mid-failover: nobody is Primary
    with pytest.raises(Unavailable, match="neither replica is Primary"):
        fleet.backend.expand_volume(vol.ref, 128 * MiB)
