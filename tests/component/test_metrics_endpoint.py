"""The CSI server's /metrics as Prometheus scrapes it: every RPC crosses the edge once, with the sidecars'
metric name, the full method name and the Go name of its status code."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
import requests

from nvmeof_csi.csi.server import serve
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.metrics import RpcMetrics, serve_metrics
from tests.support.fakes import FakeBackend
from tests.support.stack import make_services


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_metrics_endpoint_counts_rpcs_by_method_and_code(tmp_path: Path) -> None:
    services, _, _ = make_services(tmp_path, FakeBackend())
    services.observe = RpcMetrics(services.registry, "csi.nvmeof.io").observe
    port = _free_port()
    serve_metrics(f"127.0.0.1:{port}", services.registry)
    sock, stop = tmp_path / "csi.sock", asyncio.Event()
    server = asyncio.ensure_future(serve(services, Endpoint.parse(f"unix://{sock}"), 5.0, stop))
    try:
        while not sock.exists():
            await asyncio.sleep(0.02)
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            for _ in range(2):
                await csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await csi_pb2_grpc.NodeStub(channel).NodeGetVolumeHealth(
                    csi_pb2.NodeGetVolumeHealthRequest(volume_id="nvmeof-v1.loop.0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01"),
                    timeout=5,
                )
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        text = await asyncio.to_thread(lambda: requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
    finally:
        stop.set()
        await asyncio.wait_for(server, 15)
    assert (
        'csi_plugin_operations_seconds_count{driver_name="csi.nvmeof.io",grpc_status_code="OK",'
        'method_name="/csi.v1.Identity/Probe"} 2.0'
    ) in text
    assert (
        'csi_plugin_operations_seconds_count{driver_name="csi.nvmeof.io",grpc_status_code="NotFound",'
        'method_name="/csi.v1.Node/NodeGetVolumeHealth"} 1.0'
    ) in text
