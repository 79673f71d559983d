"""The pieces of an in-process CSI stack: the real servicers, edge and services on top of fakes of the backend,
connector and host."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.csi.server import CsiServices
from nvmeof_csi.gen import csi_pb2_grpc
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.service.contracts import StaticNodes
from nvmeof_csi.service.provisioning import VolumeService
from nvmeof_csi.service.records import StagingStore
from nvmeof_csi.service.staging import StagingService
from tests.support.fakes import TOPO, FakeBackend, FakeConnector, FakeHost


@dataclass
class Stack:
    backend: FakeBackend
    connector: FakeConnector
    host: FakeHost
    identity: csi_pb2_grpc.IdentityAsyncStub
    controller: csi_pb2_grpc.ControllerAsyncStub
    node: csi_pb2_grpc.NodeAsyncStub
    tmp: Path


def make_services(tmp: Path, backend: FakeBackend) -> tuple[CsiServices, FakeConnector, FakeHost]:
    (tmp / "dev").mkdir(exist_ok=True)
    host = FakeHost(tmp / "mountinfo")
    connector = FakeConnector(tmp / "dev")
    staging = StagingService(
        connector,
        Mounter(host, tmp / "mountinfo"),
        Filesystems(host),
        StagingStore(tmp / "rec"),
        size_of=lambda d: 1 << 30,
        root=tmp,
    )
    services = CsiServices(
        volumes=VolumeService(backend, StaticNodes(frozenset({"node-1"}))),
        staging=staging,
        topology=dict(TOPO),
        node_id="node-1",
        checks=[backend.health, connector.health],
    )
    return services, connector, host
