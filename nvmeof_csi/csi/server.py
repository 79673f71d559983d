"""The gRPC server: registers the servicers for the mode, owns the socket, stops gracefully.

Contract:
- A stale unix socket file (nothing accepting on it) is replaced; a live server on it is never stolen
  from: :func:`claim_socket` raises :class:`SocketInUse`.
- :func:`serve` runs until SIGTERM/SIGINT (or ``stop`` is set), then stops accepting new RPCs and gives
  in-flight RPCs ``grace_seconds`` to finish before they are cancelled; the socket file is removed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import stat
from pathlib import Path

import grpc

from nvmeof_csi.config import Endpoint, Settings
from nvmeof_csi.csi.controller import ControllerServicer
from nvmeof_csi.csi.identity import IdentityServicer
from nvmeof_csi.csi.interceptors import EdgeInterceptor
from nvmeof_csi.csi.locks import KeyedLocks
from nvmeof_csi.csi.node import NodeServicer
from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.gen import csi_pb2_grpc
from nvmeof_csi.wiring import Services

log = logging.getLogger(__name__)
RECONCILE_TIMEOUT = 60.0


class SocketInUse(FailedPrecondition):
    """Another live server listens on the endpoint's socket."""


def claim_socket(path: Path) -> None:
    """Make ``path`` free for a new server: remove a stale socket, refuse a live one or a non-socket."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale socket %s", path)
        path.unlink(missing_ok=True)
        return
    except OSError as exc:
        raise SocketInUse(f"cannot tell whether {path} is in use: {exc}") from exc
    finally:
        probe.close()
    raise SocketInUse(f"a live server is already listening on {path}")


def build_server(settings: Settings, services: Services) -> grpc.aio.Server:
    server = grpc.aio.server(interceptors=[EdgeInterceptor(KeyedLocks())])
    csi_pb2_grpc.add_IdentityServicer_to_server(
        IdentityServicer(controller=settings.mode.controller, checks=services.checks), server
    )
    if services.volumes is not None:
        csi_pb2_grpc.add_ControllerServicer_to_server(
            ControllerServicer(services.volumes), server
        )
    if services.staging is not None:
        csi_pb2_grpc.add_NodeServicer_to_server(
            NodeServicer(services.staging, services.node_id or settings.node_id, settings.max_volumes_per_node,
                         services.topology),
            server,
        )
    return server


def bind(server: grpc.aio.Server, endpoint: Endpoint) -> int:
    """Bind the endpoint; returns the TCP port (0 for unix sockets)."""
    if endpoint.scheme == "unix":
        assert endpoint.path is not None
        claim_socket(endpoint.path)
        server.add_insecure_port(endpoint.grpc_address)
        return 0
    port = server.add_insecure_port(endpoint.grpc_address)
    if port == 0:
        raise FailedPrecondition(f"cannot listen on {endpoint}")
    return port


async def run_until_stopped(
    server: grpc.aio.Server, grace_seconds: float, sockets: list[Path], stop: asyncio.Event | None = None
) -> None:
    """Start ``server``; on SIGTERM/SIGINT (or ``stop``) stop it, giving in-flight RPCs ``grace_seconds``;
    remove the unix socket files."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    try:
        await stop.wait()
        log.info("stopping: in-flight RPCs get %.0f s", grace_seconds)
        await server.stop(grace_seconds)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for path in sockets:
            path.unlink(missing_ok=True)
        log.info("stopped")


async def serve(settings: Settings, services: Services, stop: asyncio.Event | None = None) -> None:
    """Serve CSI until a signal (or ``stop``), then stop gracefully and remove the socket file."""
    server = build_server(settings, services)
    bind(server, settings.endpoint)
    if services.staging is not None:
        for action in await asyncio.to_thread(services.staging.reconcile, RECONCILE_TIMEOUT):
            log.info("reconcile: %s", action)
    log.info("serving %s (mode=%s, node=%s)", settings.endpoint, settings.mode.value, settings.node_id)
    sockets = [settings.endpoint.path] if settings.endpoint.path is not None else []
    await run_until_stopped(server, settings.grace_seconds, sockets, stop)
