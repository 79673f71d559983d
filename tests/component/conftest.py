"""In-process CSI server over a unix socket, built with the real servicers, interceptors and services on
top of fakes of the backend, connector and host."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from nvmeof_csi.csi.server import build_server
from nvmeof_csi.gen import csi_pb2_grpc
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import bind
from tests.support.fakes import FakeBackend
from tests.support.stack import Stack, make_services


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
    await channel.close(None)
    await server.stop(1)
