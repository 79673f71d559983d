"""The CSI controller on the NVMe-oF backend, over real protobuf messages, with real target-agent logic
(in-process, plain configfs trees) behind it: placement, publish ACLs, snapshots, clones, races."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvmeof_csi.agentclient.api import HostNqnNodes
from nvmeof_csi.csi.server import CsiServices, build_server
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import bind
from nvmeof_csi.service.provisioning import CapacityRange, VolumeService
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from tests.support.agents import LocalAgent, local_agents
from tests.support.requests import BAD, block_cap, mount_cap

FAB = "topology.csi.nvmeof.io/fabric"
ZONE = "topology.kubernetes.io/zone"
RDMA = "topology.csi.nvmeof.io/transport-rdma"
NODE = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-000000000001"
MiB, GiB = 1 << 20, 1 << 30
Mode_ = csi_pb2.VolumeCapability.AccessMode

FABRIC = FabricMap(
    (
        AgentEntry("store-a", Endpoint.parse("unix:///a"), "f1", "z1", ("tcp",)),
        AgentEntry("store-b", Endpoint.parse("unix:///b"), "f1", "z2", ("tcp", "rdma")),
        AgentEntry("store-c", Endpoint.parse("unix:///c"), "f2", "z1", ("tcp", "rdma")),
    )
)


@dataclass
class Ctl:
    agents: dict[str, LocalAgent]
    stub: csi_pb2_grpc.ControllerAsyncStub
    tmp: Path


def controller_services(agents: dict[str, Any]) -> CsiServices:
    backend = AgentBackend(FABRIC, client=lambda e: agents[e.name])
    return CsiServices(volumes=VolumeService(backend, HostNqnNodes()), checks=[backend.health])


@pytest.fixture
async def ctl(tmp_path: Path) -> AsyncIterator[Ctl]:
    agents = local_agents(tmp_path, ["store-a", "store-b", "store-c"], capacity=8 * GiB)
    sock = tmp_path / "ctrl.sock"
    server = build_server(controller_services(agents))
    bind(server, Endpoint.parse(f"unix://{sock}"))
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{sock}")
    yield Ctl(agents, csi_pb2_grpc.ControllerStub(channel), tmp_path)
    await channel.close(None)
    await server.stop(1)


def create_req(
    name: str,
    size: int = GiB,
    requisite: Sequence[dict[str, str]] = (),
    preferred: Sequence[dict[str, str]] = (),
    params: dict[str, str] | None = None,
    cap: csi_pb2.VolumeCapability | None = None,
    source: csi_pb2.VolumeContentSource | None = None,
) -> csi_pb2.CreateVolumeRequest:
    req = csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
        volume_capabilities=[cap or mount_cap()],
        parameters=params or {},
        volume_content_source=source,
    )
    if requisite or preferred:
        req.accessibility_requirements.CopyFrom(
            csi_pb2.TopologyRequirement(
                requisite=[csi_pb2.Topology(segments=t) for t in requisite],
                preferred=[csi_pb2.Topology(segments=t) for t in preferred],
            )
        )
    return req


def agent_of(volume_id: str) -> str:
    return volume_id.split(".")[1]


async def test_placement_honours_requisite_preferred_and_capacity(ctl: Ctl) -> None:
    v1 = (await ctl.stub.CreateVolume(create_req("p1", requisite=[{FAB: "f2"}]))).volume
    assert agent_of(v1.volume_id) == "store-c"
    assert [dict(t.segments) for t in v1.accessible_topology] == [{FAB: "f2", ZONE: "z1"}]
    v2 = (
        await ctl.stub.CreateVolume(
            create_req("p2", requisite=[{FAB: "f1"}, {FAB: "f2"}], preferred=[{FAB: "f1", ZONE: "z2"}, {FAB: "f2"}])
        )
    ).volume
    assert agent_of(v2.volume_id) == "store-b"
    v3 = (
        await ctl.stub.CreateVolume(
            create_req("p3", params={"transport": "rdma"}, requisite=[{FAB: "f1", RDMA: "true"}])
        )
    ).volume
    assert agent_of(v3.volume_id) == "store-b" and dict(v3.accessible_topology[0].segments)[RDMA] == "true"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ctl.stub.CreateVolume(create_req("p4", params={"transport": "rdma"}, requisite=[{FAB: "f1", ZONE: "z1"}]))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ctl.stub.CreateVolume(create_req("too-big", size=9 * GiB))
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE  # larger than any agent has
    for _ in range(3):  # most free capacity within the segment wins, so f1 volumes spread over a and b
        await ctl.stub.CreateVolume(create_req(f"spread-{_}", size=2 * GiB, requisite=[{FAB: "f1"}]))
    used = {name: a.agent.provisioned_bytes() for name, a in ctl.agents.items()}
    assert used["store-a"] >= 2 * GiB and used["store-b"] >= 2 * GiB
    cap = await ctl.stub.GetCapacity(
        csi_pb2.GetCapacityRequest(accessible_topology=csi_pb2.Topology(segments={FAB: "f2"}))
    )
    assert cap.available_capacity == 8 * GiB - used["store-c"]


async def test_volume_context_and_publish_acl(ctl: Ctl) -> None:
    vol = (
        await ctl.stub.CreateVolume(
            create_req("ctx", params={"ctrlLossTmo": "120", "queueSize": "64"}, requisite=[{FAB: "f2"}])
        )
    ).volume
    ctx = dict(vol.volume_context)
    assert ctx["nqn"] == f"nqn.2026-11.io.nvmeof:vol:{vol.volume_id.split('.')[-1]}"
    assert ctx["transport"] == "tcp" and ctx["ctrlLossTmo"] == "120" and ctx["queueSize"] == "64"
    assert ctx["portals"] == "tcp:127.0.0.1:4420,tcp:127.0.0.2:4421"
    pub = csi_pb2.ControllerPublishVolumeRequest(volume_id=vol.volume_id, node_id=NODE, volume_capability=mount_cap())
    resp = await ctl.stub.ControllerPublishVolume(pub)
    assert dict(resp.publish_context) == {"hostNqn": NODE, "readonly": "false"}
    agent = ctl.agents["store-c"].agent
    nqn = ctx["nqn"]
    assert agent.nvmet.allowed_hosts(nqn) == [NODE]
    pub.readonly = True
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ctl.stub.ControllerPublishVolume(pub)
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    listed = await ctl.stub.ListVolumes(csi_pb2.ListVolumesRequest())
    assert [list(e.status.published_node_ids) for e in listed.entries] == [[NODE]]
    got = await ctl.stub.ControllerGetVolume(csi_pb2.ControllerGetVolumeRequest(volume_id=vol.volume_id))
    assert list(got.status.published_node_ids) == [NODE]
    health_req = csi_pb2.ControllerGetVolumeHealthRequest(volume_id=vol.volume_id)
    health = (await ctl.stub.ControllerGetVolumeHealth(health_req)).volume_health
    assert health.volume_id == vol.volume_id and list(health.health_statuses) == []
    agent.nvmet.unlink(2, nqn)  # one portal lost on the target: degraded, naming the port
    entries = (await ctl.stub.ControllerGetVolumeHealth(health_req)).volume_health.health_statuses
    assert [(e.status, e.reason) for e in entries] == [(csi_pb2.DEGRADED, "PortUnlinked")]
    assert "127.0.0.2:4421" in entries[0].message
    agent.nvmet.unlink(1, nqn)
    listed_health = await ctl.stub.ControllerListVolumeHealth(csi_pb2.ControllerListVolumeHealthRequest())
    mine = [h for h in listed_health.entries if h.volume_id == vol.volume_id]
    assert [(e.status, e.reason) for e in mine[0].health_statuses] == [(csi_pb2.INACCESSIBLE, "NoPortLinked")]
    agent.store.volume_path(vol.volume_id.split(".")[-1]).unlink()  # the backing file gone: data loss
    entries = (await ctl.stub.ControllerGetVolumeHealth(health_req)).volume_health.health_statuses
    assert (csi_pb2.DATA_LOSS, "BackingFileMissing") in [(e.status, e.reason) for e in entries]
    agent.converge()  # the agent puts configfs back (the file stays lost)
    for _ in range(2):
        await ctl.stub.ControllerUnpublishVolume(
            csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id, node_id=NODE)
        )
    assert agent.nvmet.allowed_hosts(nqn) == [] and agent.nvmet.hosts() == []


async def test_snapshots_clones_and_listing(ctl: Ctl) -> None:
    src = (await ctl.stub.CreateVolume(create_req("src", size=64 * MiB, requisite=[{FAB: "f2"}]))).volume
    path = ctl.agents["store-c"].agent.store.volume_path(src.volume_id.split(".")[-1])
    with open(path, "r+b") as f:
        f.write(b"dataset-shard-0")
    snap = (
        await ctl.stub.CreateSnapshot(csi_pb2.CreateSnapshotRequest(name="s1", source_volume_id=src.volume_id))
    ).snapshot
    again = (
        await ctl.stub.CreateSnapshot(csi_pb2.CreateSnapshotRequest(name="s1", source_volume_id=src.volume_id))
    ).snapshot
    assert snap.snapshot_id == again.snapshot_id and snap.ready_to_use and snap.size_bytes == 64 * MiB
    clone_src = csi_pb2.VolumeContentSource(
        snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snap.snapshot_id)
    )
    clone = (await ctl.stub.CreateVolume(create_req("from-snap", size=MiB, source=clone_src))).volume
    assert clone.capacity_bytes == 64 * MiB and clone.content_source.snapshot.snapshot_id == snap.snapshot_id
    assert agent_of(clone.volume_id) == "store-c"
    with open(ctl.agents["store-c"].agent.store.volume_path(clone.volume_id.split(".")[-1]), "rb") as f:
        assert f.read(15) == b"dataset-shard-0"
    with pytest.raises(grpc.aio.AioRpcError) as info:  # the snapshot's agent is not on f1
        await ctl.stub.CreateVolume(create_req("far", source=clone_src, requisite=[{FAB: "f1"}]))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    vol_src = csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=src.volume_id))
    vclone = (await ctl.stub.CreateVolume(create_req("from-vol", size=64 * MiB, source=vol_src))).volume
    assert vclone.content_source.volume.volume_id == src.volume_id
    for i in range(3):
        await ctl.stub.CreateSnapshot(csi_pb2.CreateSnapshotRequest(name=f"s-{i}", source_volume_id=vclone.volume_id))
    seen, token = [], ""
    while True:
        page = await ctl.stub.ListSnapshots(csi_pb2.ListSnapshotsRequest(max_entries=2, starting_token=token))
        seen += [e.snapshot.snapshot_id for e in page.entries]
        token = page.next_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 4
    only = await ctl.stub.ListSnapshots(csi_pb2.ListSnapshotsRequest(source_volume_id=src.volume_id))
    assert [e.snapshot.snapshot_id for e in only.entries] == [snap.snapshot_id]
    one = await ctl.stub.ListSnapshots(csi_pb2.ListSnapshotsRequest(snapshot_id=snap.snapshot_id))
    assert len(one.entries) == 1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ctl.stub.CreateSnapshot(csi_pb2.CreateSnapshotRequest(name="s1", source_volume_id=vclone.volume_id))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    for _ in range(2):
        await ctl.stub.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
    assert len((await ctl.stub.ListSnapshots(csi_pb2.ListSnapshotsRequest())).entries) == 3


async def test_a_restarted_controller_finds_everything(ctl: Ctl) -> None:
    vol = (await ctl.stub.CreateVolume(create_req("keep"))).volume
    fresh = controller_services(ctl.agents).volumes
    assert fresh is not None
    again = await asyncio.to_thread(fresh.create, "keep", CapacityRange(GiB), VolumeParameters())
    assert f"nvmeof-v1.{again.ref.location}.{again.ref.uuid}" == vol.volume_id


# fmt: off
EXTRA_BAD = [
    ("CreateVolume", create_req("x", source=csi_pb2.VolumeContentSource(snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id="nvmeof-snap-v1.store-a." + str(uuid.uuid4())))), "NOT_FOUND", "does not exist"),
    ("CreateVolume", create_req("x", source=csi_pb2.VolumeContentSource(snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id="garbage"))), "NOT_FOUND", "not an ID"),
    ("CreateVolume", create_req("x", source=csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id="nvmeof-v1.store-z." + str(uuid.uuid4())))), "NOT_FOUND", "does not exist"),
    ("CreateVolume", create_req("x", params={"transport": "fc"}), "INVALID_ARGUMENT", "transport"),
    ("CreateVolume", create_req("x", params={"ctrlLossTmo": "-1"}), "INVALID_ARGUMENT", "ctrlLossTmo"),
    ("CreateVolume", create_req("x", cap=block_cap(Mode_.MULTI_NODE_MULTI_WRITER), requisite=[{FAB: "nowhere"}]), "RESOURCE_EXHAUSTED", "topology"),
    ("CreateSnapshot", csi_pb2.CreateSnapshotRequest(source_volume_id="nvmeof-v1.store-a." + str(uuid.uuid4())), "INVALID_ARGUMENT", "name"),
    ("CreateSnapshot", csi_pb2.CreateSnapshotRequest(name="s"), "INVALID_ARGUMENT", "source_volume_id"),
    ("CreateSnapshot", csi_pb2.CreateSnapshotRequest(name="s", source_volume_id="nvmeof-v1.store-a." + str(uuid.uuid4())), "NOT_FOUND", "does not exist"),
    ("DeleteSnapshot", csi_pb2.DeleteSnapshotRequest(), "INVALID_ARGUMENT", "snapshot_id"),
    ("ListSnapshots", csi_pb2.ListSnapshotsRequest(starting_token="zzz"), "ABORTED", "starting_token"),
    ("ControllerPublishVolume", csi_pb2.ControllerPublishVolumeRequest(volume_id="nvmeof-v1.store-a." + str(uuid.uuid4()), node_id=NODE, volume_capability=mount_cap()), "NOT_FOUND", "does not exist"),
    ("GetSnapshot", csi_pb2.GetSnapshotRequest(), "INVALID_ARGUMENT", "snapshot_id"),
    ("ControllerGetVolumeHealth", csi_pb2.ControllerGetVolumeHealthRequest(), "INVALID_ARGUMENT", "volume_id"),
    ("ControllerListVolumeHealth", csi_pb2.ControllerListVolumeHealthRequest(starting_token="zzz"), "ABORTED", "starting_token"),
    ("ControllerGetNodeInfo", csi_pb2.ControllerGetNodeInfoRequest(node_id="x" * 300), "UNIMPLEMENTED", "NodeGetInfo"),
]
# fmt: on
TABLE = [  # the foundation table, minus what differs on a backend with snapshots
    (rpc, req, code, needle) for side, rpc, req, code, needle in BAD if side == "controller" and rpc != "CreateSnapshot"
] + EXTRA_BAD


@pytest.mark.parametrize(
    ("rpc", "request_msg", "code", "needle"), TABLE, ids=[f"{t[0]}-{i}" for i, t in enumerate(TABLE)]
)
async def test_malformed_requests_on_the_agent_backend(
    ctl: Ctl, rpc: str, request_msg: object, code: str, needle: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await getattr(ctl.stub, rpc)(request_msg)
    assert info.value.code().name == code, info.value.details()
    assert needle in (info.value.details() or "")


def test_every_controller_rpc_that_takes_an_id_name_or_token_has_a_malformed_case() -> None:
    """A Controller RPC added to the spec (or a field added to one) without a case in TABLE fails here."""
    takes_input = {
        m.name
        for m in csi_pb2.DESCRIPTOR.services_by_name["Controller"].methods
        if any(
            f.type == f.TYPE_STRING and (f.name.endswith("_id") or f.name in ("name", "starting_token"))
            for f in m.input_type.fields
        )
    }
    assert takes_input - {rpc for rpc, *_ in TABLE} == set()


async def test_modify_volume_records_mutable_limits_on_the_agent(ctl: Ctl) -> None:
    """VolumeAttributesClass at creation, then live changes: recorded with the volume on its agent (which the
    node reads back), idempotently; sidecar keys ignored; absent keys unchanged; anything else refused."""
    req = create_req("qos", params={"readIops": "100"}, requisite=[{FAB: "f2"}])
    req.mutable_parameters.update({"writeIops": "50", "csi.storage.k8s.io/pvc/name": "data"})
    vol = (await ctl.stub.CreateVolume(req)).volume
    assert dict(vol.volume_context)["readIops"] == "100" and dict(vol.volume_context)["writeIops"] == "50"
    again = create_req("qos", params={"readIops": "100"}, requisite=[{FAB: "f2"}])
    assert (await ctl.stub.CreateVolume(again)).volume.volume_id == vol.volume_id  # mutable keys never conflict
    agent = ctl.agents["store-c"].agent
    vol_uuid = vol.volume_id.split(".")[-1]

    def held() -> dict[str, str]:
        return {k: v for k, v in agent.get_volume(vol_uuid, "").record.parameters.items() if "Iops" in k or "Bps" in k}

    modify = csi_pb2.ControllerModifyVolumeRequest(
        volume_id=vol.volume_id,
        mutable_parameters={"readIops": "300", "readBps": "max", "csi.storage.k8s.io/pv/name": "pv-1"},
    )
    for _ in range(2):  # repeated: the same outcome
        await ctl.stub.ControllerModifyVolume(modify)
        assert held() == {"readIops": "300", "writeIops": "50"}  # readBps max: lifted, so not held
    await ctl.stub.ControllerModifyVolume(csi_pb2.ControllerModifyVolumeRequest(volume_id=vol.volume_id))
    assert held() == {"readIops": "300", "writeIops": "50"}  # readBps max: lifted, so not held
    for bad, code in (
        ({"queueSize": "64"}, grpc.StatusCode.INVALID_ARGUMENT),  # needs a reconnect: not mutable
        ({"XXX_FakeKey": "x"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"writeIops": "-5"}, grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ctl.stub.ControllerModifyVolume(
                csi_pb2.ControllerModifyVolumeRequest(volume_id=vol.volume_id, mutable_parameters=bad)
            )
        assert info.value.code() == code, bad
    assert held() == {"readIops": "300", "writeIops": "50"}  # readBps max: lifted, so not held
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ctl.stub.ControllerModifyVolume(
            csi_pb2.ControllerModifyVolumeRequest(
                volume_id=f"nvmeof-v1.store-c.{uuid.uuid4()}", mutable_parameters={"readIops": "1"}
            )
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    bad_create = create_req("qos-bad")
    bad_create.mutable_parameters["nrIoQueues"] = "4"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ctl.stub.CreateVolume(bad_create)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    caps = await ctl.stub.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest())
    assert csi_pb2.ControllerServiceCapability.RPC.MODIFY_VOLUME in [c.rpc.type for c in caps.capabilities]
