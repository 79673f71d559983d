"""The threaded server and its edge (what the target agent serves on): the error boundary maps domain errors to
their codes and anything else to INTERNAL, the lock table refuses a second call on a busy key, one call's
contextvars never leak into the next call on the same thread (grpc gives each call a fresh context; the agent's
caller identity relies on it), and SIGTERM lets an in-flight call finish
within the grace and removes the socket."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvmeof_csi.errors import NotFound
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.gen import nvmeof_agent_pb2_grpc as pb_grpc
from nvmeof_csi.rpc import logctx
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import bind, new_threaded_server, run_until_stopped

LEAK: contextvars.ContextVar[str] = contextvars.ContextVar("leak", default="")


class Servicer(pb_grpc.AgentServicer):  # only the methods these tests call
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.seen: list[tuple[str, str]] = []

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        self.seen.append((LEAK.get(), logctx.request_id.get()))
        LEAK.set("set by an earlier call")
        return pb.HealthResponse(ready=True)

    def DeleteVolume(self, request: pb.DeleteVolumeRequest, context: grpc.ServicerContext) -> Any:
        if request.uuid == "missing":
            raise NotFound("volume missing does not exist")
        if request.uuid == "bug":
            raise KeyError("bug in the service")
        self.entered.set()
        self.gate.wait(10)
        return pb.DeleteVolumeResponse()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Servicer, pb_grpc.AgentStub]]:
    servicer = Servicer()  # type: ignore[abstract]
    server = new_threaded_server({"/nvmeof.agent.v1.Agent/DeleteVolume": ("uuid",)}, workers=4)
    pb_grpc.add_AgentServicer_to_server(servicer, server)
    bind(server, Endpoint.parse(f"unix://{tmp_path / 'a.sock'}"))
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'a.sock'}")
    try:
        yield servicer, pb_grpc.AgentStub(channel)
    finally:
        servicer.gate.set()
        channel.close()
        server.stop(0).wait()


def test_domain_errors_keep_their_code_and_anything_else_is_internal(
    served: tuple[Servicer, pb_grpc.AgentStub], caplog: pytest.LogCaptureFixture
) -> None:
    _, stub = served
    with pytest.raises(grpc.RpcError) as missing:
        stub.DeleteVolume(pb.DeleteVolumeRequest(uuid="missing"), timeout=10)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND and "does not exist" in (missing.value.details() or "")
    with caplog.at_level(logging.INFO, logger="nvmeof_csi.rpc"), pytest.raises(grpc.RpcError) as bug:
        stub.DeleteVolume(pb.DeleteVolumeRequest(uuid="bug"), timeout=10)
    assert bug.value.code() == grpc.StatusCode.INTERNAL
    assert any(r.exc_info and "bug in the service" in str(r.exc_info[1]) for r in caplog.records)


def test_a_busy_key_is_aborted_and_free_again_after_the_call(served: tuple[Servicer, pb_grpc.AgentStub]) -> None:
    servicer, stub = served
    first = stub.DeleteVolume.future(pb.DeleteVolumeRequest(uuid="v1"), timeout=20)
    assert servicer.entered.wait(10)
    with pytest.raises(grpc.RpcError) as busy:
        stub.DeleteVolume(pb.DeleteVolumeRequest(uuid="v1"), timeout=10)
    assert busy.value.code() == grpc.StatusCode.ABORTED
    servicer.gate.set()
    first.result()
    stub.DeleteVolume(pb.DeleteVolumeRequest(uuid="v1"), timeout=10)  # released


def test_one_calls_contextvars_never_reach_the_next(served: tuple[Servicer, pb_grpc.AgentStub]) -> None:
    servicer, stub = served
    for n in range(12):  # more calls than threads: threads are reused
        stub.Health(pb.HealthRequest(), timeout=10, metadata=(("x-request-id", f"r{n}"),))
    assert [leak for leak, _ in servicer.seen] == [""] * 12
    assert [rid for _, rid in servicer.seen] == [f"r{n}" for n in range(12)]


async def test_sigterm_lets_an_inflight_call_finish_and_removes_the_socket(tmp_path: Path) -> None:
    servicer = Servicer()  # type: ignore[abstract]
    server = new_threaded_server({})
    pb_grpc.add_AgentServicer_to_server(servicer, server)
    sock = tmp_path / "a.sock"
    bind(server, Endpoint.parse(f"unix://{sock}"))
    serving = asyncio.ensure_future(run_until_stopped(server, 5.0, [sock]))
    while not sock.exists():
        await asyncio.sleep(0.02)
    channel = grpc.insecure_channel(f"unix://{sock}")
    call = pb_grpc.AgentStub(channel).DeleteVolume.future(pb.DeleteVolumeRequest(uuid="slow"), timeout=20)
    assert await asyncio.to_thread(servicer.entered.wait, 10)
    threading.Timer(1.0, servicer.gate.set).start()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(serving, 15)
    assert isinstance(await asyncio.to_thread(call.result), pb.DeleteVolumeResponse)
    channel.close()
    assert not sock.exists()


def test_calls_past_the_bound_are_refused_not_queued(tmp_path: Path) -> None:
    """Before, a threaded server queued every call past its threads without bound (the agent's 128 threads, then
    any number waiting). Now at most as many again wait; the rest are refused at once."""
    servicer = Servicer()  # type: ignore[abstract]
    server = new_threaded_server({}, workers=1)
    pb_grpc.add_AgentServicer_to_server(servicer, server)
    bind(server, Endpoint.parse(f"unix://{tmp_path / 'b.sock'}"))
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'b.sock'}")
    stub = pb_grpc.AgentStub(channel)
    try:
        held = [stub.DeleteVolume.future(pb.DeleteVolumeRequest(uuid=f"v{i}"), timeout=20) for i in range(2)]
        assert servicer.entered.wait(10)  # one runs, one waits for the thread
        with pytest.raises(grpc.RpcError) as third:
            stub.DeleteVolume(pb.DeleteVolumeRequest(uuid="v3"), timeout=10)
        assert third.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        servicer.gate.set()
        assert all(isinstance(f.result(), pb.DeleteVolumeResponse) for f in held)
    finally:
        servicer.gate.set()
        channel.close()
        server.stop(0).wait()
