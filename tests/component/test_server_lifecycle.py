"""Graceful stop on SIGTERM, and socket ownership (stale replaced, live never stolen)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import pytest

from nvmeof_csi.csi.server import serve
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import SocketInUse, claim_socket
from tests.support.fakes import FakeBackend
from tests.support.requests import mount_cap
from tests.support.stack import make_services


async def _slow_create_during_sigterm(tmp_path: Path, grace: float, hold: float) -> tuple[object, float, Path]:
    backend = FakeBackend()
    backend.gate = threading.Event()
    services, _, _ = make_services(tmp_path, backend)
    sock = tmp_path / "csi.sock"
    server_task = asyncio.ensure_future(serve(services, Endpoint.parse(f"unix://{sock}"), grace))
    while not sock.exists():
        await asyncio.sleep(0.02)
    channel = grpc.aio.insecure_channel(f"unix://{sock}")
    stub = csi_pb2_grpc.ControllerStub(channel)
    call = asyncio.ensure_future(
        stub.CreateVolume(csi_pb2.CreateVolumeRequest(name="slow", volume_capabilities=[mount_cap()]), timeout=30)
    )
    await asyncio.to_thread(backend.entered.wait, 5)
    threading.Timer(hold, backend.gate.set).start()
    start = time.monotonic()
    os.kill(os.getpid(), signal.SIGTERM)
    outcome: object
    try:
        outcome = await call
    except grpc.aio.AioRpcError as err:
        outcome = err.code()
    await asyncio.wait_for(server_task, 15)
    stopped_after = time.monotonic() - start
    await channel.close(None)
    backend.gate.set()
    return outcome, stopped_after, sock


async def test_sigterm_lets_a_slow_rpc_finish_and_removes_the_socket(tmp_path: Path) -> None:
    outcome, stopped_after, sock = await _slow_create_during_sigterm(tmp_path, grace=5.0, hold=1.0)
    assert isinstance(outcome, csi_pb2.CreateVolumeResponse) and outcome.volume.volume_id
    assert stopped_after < 5.0 + 2
    assert not sock.exists()


async def test_sigterm_cancels_an_rpc_that_outlives_the_grace(tmp_path: Path) -> None:
    outcome, stopped_after, sock = await _slow_create_during_sigterm(tmp_path, grace=0.5, hold=4.0)
    assert outcome in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)
    assert stopped_after < 0.5 + 3
    assert not sock.exists()


def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "csi.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # file remains, nobody listens
    claim_socket(path)
    assert not path.exists()


def test_live_socket_is_never_stolen(tmp_path: Path) -> None:
    path = tmp_path / "csi.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen(1)
    try:
        with pytest.raises(SocketInUse, match="live server"):
            claim_socket(path)
        assert path.exists()
    finally:
        live.close()


def test_regular_file_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "csi.sock"
    path.write_text("precious")
    with pytest.raises(SocketInUse, match="not a socket"):
        claim_socket(path)
    assert path.read_text() == "precious"
