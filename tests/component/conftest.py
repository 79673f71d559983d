"""In-process CSI server over a unix socket, built with the real servicers, interceptors and services on
top of fakes of the backend, connector and host."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from nvmeof_csi.csi.server import CsiServices, build_server
from nvmeof_csi.gen import csi_pb2_grpc
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import bind
from nvmeof_csi.service.ports import StaticNodes
from nvmeof_csi.service.records import StagingStore
from nvmeof_csi.service.staging import StagingService
from nvmeof_csi.service.volumes import VolumeService
from tests.fakes import TOPO, FakeBackend, FakeConnector, FakeHost


@dataclass
class Stack:
    backend: FakeBackend
    connector: FakeConnector
    host: FakeHost
    identity: csi_pb2_grpc.IdentityStub
    controller: csi_pb2_grpc.ControllerStub
    node: csi_pb2_grpc.NodeStub
    tmp: Path


def make_services(tmp: Path, backend: FakeBackend) -> tuple[CsiServices, FakeConnector, FakeHost]:
    (tmp / "dev").mkdir(exist_ok=True)
    host = FakeHost(tmp / "mountinfo")
    connector = FakeConnector(tmp / "dev")
    staging = StagingService(
        connector, Mounter(host, tmp / "mountinfo"), Filesystems(host), StagingStore(tmp / "rec"), size_of=lambda d: 1 << 30
    )
    services = CsiServices(
        volumes=VolumeService(backend, StaticNodes(frozenset({"node-1"}))),
        staging=staging,
        topology=dict(TOPO),
        node_id="node-1",
        checks=[backend.health, connector.health],
    )
    return services, connector, host


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    backend = FakeBackend(100 << 30)
    services, connector, host = make_services(tmp_path, backend)
    sock = tmp_path / "csi.sock"
    server = build_server(services)
    bind(server, Endpoint.parse(f"unix://{sock}"))
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{sock}")
    yield Stack(
        backend,
        connector,
        host,
        csi_pb2_grpc.IdentityStub(channel),
        csi_pb2_grpc.ControllerStub(channel),
        csi_pb2_grpc.NodeStub(channel),
        tmp_path,
    )
    await channel.close()
    await server.stop(1)
