"""Server lifecycle shared by every gRPC service (CSI and the target agent): sockets, TLS, graceful stop.

Contract:
- A stale unix socket file (nothing accepting on it) is replaced; a live server on it is never stolen
  from: :func:`claim_socket` raises :class:`SocketInUse`.
- :func:`run_until_stopped` runs until SIGTERM/SIGINT (or ``stop`` is set), then stops accepting new RPCs and
  gives in-flight RPCs ``grace_seconds`` to finish before they are cancelled; the socket files are removed.
- :func:`new_server` (asyncio) and :func:`new_threaded_server` (a pool of threads: for a service whose every
  call is blocking work) put the shared edge (request IDs, logs, the service's lock table, the one error
  boundary) in front of every servicer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import grpc

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.rpc.edge import Authorize, EdgeInterceptor, Observe, ThreadedEdgeInterceptor
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles
from nvmeof_csi.rpc.locks import KeyedLocks, LockTable

log = logging.getLogger(__name__)
Server = grpc.aio.Server | grpc.Server


#: Bounds every server takes: a TLS (or any) handshake that does not finish within 30 s is dropped, and one
#: connection carries at most 64 calls at once (a client cannot hold the server's memory with slow handshakes or
#: with one connection's streams).
SERVER_OPTIONS = (("grpc.server_handshake_timeout_ms", 30_000), ("grpc.max_concurrent_streams", 64))
#: Calls in flight on the CSI server before a new one is refused with RESOURCE_EXHAUSTED (the sidecars retry).
CSI_MAX_CALLS = 256


def new_server(
    lock_table: LockTable,
    authorize: Authorize | None = None,
    observe: Observe | None = None,
    max_calls: int = CSI_MAX_CALLS,
) -> grpc.aio.Server:
    """An asyncio gRPC server whose every unary call crosses the shared edge with ``lock_table`` (and
    ``authorize``, when the service authorizes its callers; ``observe`` gets every call's code and duration).
    More than ``max_calls`` calls in flight: the next is refused with RESOURCE_EXHAUSTED."""
    return grpc.aio.server(
        interceptors=[EdgeInterceptor(KeyedLocks(), lock_table, authorize, observe)],
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=max_calls,
    )


def new_threaded_server(
    lock_table: LockTable,
    authorize: Authorize | None = None,
    observe: Observe | None = None,
    workers: int = 32,
) -> grpc.Server:
    """A gRPC server whose handlers run on a pool of ``workers`` threads, behind the same edge as
    :func:`new_server`. A call beyond ``workers`` in flight waits for a free thread, up to as many again; past
    that, a call is refused with RESOURCE_EXHAUSTED (never an unbounded queue)."""
    return grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
        interceptors=[ThreadedEdgeInterceptor(KeyedLocks(), lock_table, authorize, observe)],
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=2 * workers,
    )


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


def bind(server: Server, endpoint: Endpoint, socket_mode: int | None = None) -> int:
    """Bind the endpoint; returns the TCP port (0 for unix sockets). With ``socket_mode`` a unix socket is
    created with that mode from its first moment (the umask is narrowed while it is bound), so no other user
    can connect in a window before a chmod."""
    if endpoint.scheme == "unix":
        assert endpoint.path is not None
        claim_socket(endpoint.path)
        if socket_mode is None:
            server.add_insecure_port(endpoint.grpc_address)
            return 0
        previous = os.umask(0o777 & ~socket_mode)
        try:
            server.add_insecure_port(endpoint.grpc_address)
        finally:
            os.umask(previous)
        endpoint.path.chmod(socket_mode)
        return 0
    port = server.add_insecure_port(endpoint.grpc_address)
    if port == 0:
        raise FailedPrecondition(f"cannot listen on {endpoint}")
    return port


async def run_until_stopped(
    server: Server,
    grace_seconds: float,
    sockets: list[Path],
    stop: asyncio.Event | None = None,
    socket_mode: int | None = None,
    started: asyncio.Event | None = None,
) -> None:
    """Start ``server`` (then set ``started``); on SIGTERM/SIGINT (or ``stop``) stop it, giving in-flight RPCs
    ``grace_seconds``; remove the unix socket files."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if isinstance(server, grpc.aio.Server):
        await server.start()
    else:
        server.start()  # returns once it serves, on threads of its own
    if started is not None:
        started.set()
    if socket_mode is not None:
        for path in sockets:
            path.chmod(socket_mode)
    try:
        await stop.wait()
        log.info("stopping: in-flight RPCs get %.0f s", grace_seconds)
        if isinstance(server, grpc.aio.Server):
            await server.stop(grace_seconds)
        else:
            await asyncio.to_thread(lambda: server.stop(grace_seconds).wait())
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for path in sockets:
            path.unlink(missing_ok=True)
        log.info("stopped")


def _stamp(tls: TlsFiles) -> tuple[int, int]:
    return tls.cert.stat().st_mtime_ns, tls.key.stat().st_mtime_ns


def bind_mtls(server: Server, endpoint: Endpoint, tls: TlsFiles, extra_ca: bytes = b"", reload: bool = False) -> int:
    """Listen on a TCP ``endpoint`` with mutual TLS: clients must present a certificate that ``tls.ca`` (or the
    ``extra_ca`` PEM, for instance the node CA) signed. ``reload``: a new certificate and key written over
    ``tls.cert`` and ``tls.key`` (a renewal) serve every handshake after it."""
    roots = tls.ca.read_bytes().rstrip(b"\n") + b"\n" + extra_ca

    def config() -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(tls.key.read_bytes(), tls.cert.read_bytes())], roots)

    if not reload:
        creds = grpc.ssl_server_credentials(
            [(tls.key.read_bytes(), tls.cert.read_bytes())], root_certificates=roots, require_client_auth=True
        )
    else:
        seen = [_stamp(tls)]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            stamp = _stamp(tls)
            if stamp == seen[0]:
                return None
            seen[0] = stamp
            return config()

        # gRPC documents None from the fetcher as "no change"; grpc-stubs types it without None
        fetcher = cast("Callable[[], grpc.ServerCertificateConfiguration]", fetch)
        creds = grpc.dynamic_ssl_server_credentials(config(), fetcher, require_client_authentication=True)
    port = server.add_secure_port(endpoint.grpc_address, creds)
    if port == 0:
        raise FailedPrecondition(f"cannot listen on {endpoint}")
    return port
