"""Kubelet's side of plugin registration, played by this test against the node plugin's own registration
socket (``--registration-dir``), and the ``/healthz`` endpoint kubelet's liveness probe would call."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import grpc
import pytest

from nvmeof_csi.csi import registration as reg
from nvmeof_csi.csi.registration import KubeletRegistration
from nvmeof_csi.csi.server import serve
from nvmeof_csi.gen import csi_pb2, csi_pb2_grpc
from nvmeof_csi.gen import pluginregistration_pb2 as pb
from nvmeof_csi.gen import pluginregistration_pb2_grpc as pb_grpc
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.service.contracts import Health
from tests.support.fakes import FakeBackend
from tests.support.stack import make_services


async def _wait_for(path: Path, other_than: tuple[int, int] | None = None) -> tuple[int, int]:
    """Identity (inode, change time) of the socket at ``path`` once there is one; with ``other_than`` (the old
    one's identity) a socket made anew: seen gone first, or with another identity (inode numbers are reused)."""
    gone = other_than is None
    for _ in range(1000):
        try:
            st = path.stat()
        except FileNotFoundError:
            gone = True
            await asyncio.sleep(0.01)
            continue
        if gone or (st.st_ino, st.st_ctime_ns) != other_than:
            return st.st_ino, st.st_ctime_ns
        await asyncio.sleep(0.01)
    raise AssertionError(f"no (new) socket at {path}")


async def _http(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_kubelet_registers_the_node_plugin_and_a_refusal_is_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(reg, "FIRST_RETRY", 0.2)
    services, _, _ = make_services(tmp_path, FakeBackend())
    healthy = [True]
    services.checks.append(lambda: Health(healthy[0], "all good" if healthy[0] else "initiator not ready"))
    csi_sock, reg_dir, port = tmp_path / "csi.sock", tmp_path / "plugins_registry", _free_port()
    reg_dir.mkdir()
    kubelet_path = "/var/lib/kubelet/plugins/csi.nvmeof.io/csi.sock"  # the CSI socket as kubelet sees it
    stop = asyncio.Event()
    server = asyncio.ensure_future(
        serve(
            services,
            Endpoint.parse(f"unix://{csi_sock}"),
            5.0,
            stop,
            registration=KubeletRegistration(reg_dir, "csi.nvmeof.io", kubelet_path),
            health_listen=f"127.0.0.1:{port}",
        )
    )
    reg_sock = reg_dir / "csi.nvmeof.io-reg.sock"
    try:
        first = await _wait_for(reg_sock)
        assert csi_sock.exists()  # the registration socket appears only once CSI serves
        async with grpc.aio.insecure_channel(f"unix://{reg_sock}") as channel:
            info = await pb_grpc.RegistrationStub(channel).GetInfo(pb.InfoRequest(), timeout=5)
            assert (info.type, info.name, info.endpoint) == ("CSIPlugin", "csi.nvmeof.io", kubelet_path)
            assert list(info.supported_versions) == ["1.0.0"]
            await pb_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                pb.RegistrationStatus(plugin_registered=False, error="driver name already taken"), timeout=5
            )
        assert "kubelet refused to register csi.nvmeof.io: driver name already taken" in caplog.text
        await _wait_for(reg_sock, other_than=first)  # made anew: kubelet's watcher sees a new plugin
        async with grpc.aio.insecure_channel(f"unix://{reg_sock}") as channel:
            await pb_grpc.RegistrationStub(channel).GetInfo(pb.InfoRequest(), timeout=5)
            await pb_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                pb.RegistrationStatus(plugin_registered=True), timeout=5
            )
        assert "kubelet registered csi.nvmeof.io" in caplog.text
        async with grpc.aio.insecure_channel(f"unix://{csi_sock}") as channel:  # what kubelet calls next
            node = await csi_pb2_grpc.NodeStub(channel).NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=5)
            assert node.node_id
        assert await _http(port, "/healthz") == (200, "ok")
        healthy[0] = False
        assert await _http(port, "/healthz") == (503, "initiator not ready")
        assert await _http(port, "/livez") == (200, "alive")  # not ready is not dead: liveness never restarts it
        assert (await _http(port, "/metrics"))[0] == 404
    finally:
        stop.set()
        await asyncio.wait_for(server, 15)
    assert not reg_sock.exists() and not csi_sock.exists()
