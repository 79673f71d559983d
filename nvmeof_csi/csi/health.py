"""A plain HTTP health endpoint for kubelet's probes where the livenessprobe sidecar cannot be had.
``GET /healthz`` (readiness): 200 ``ok`` when every check is ready, 503 with the failing checks' messages
otherwise. ``GET /livez`` (liveness, start-up): 200 ``alive`` whenever the process answers, without running any
check -- a controller whose agents are all down, or a node whose kernel lacks a module, is not ready, but
restarting it would fix nothing (and a controller restarted while an agent restarts delays both). 404 for any
other path. Checks run in a worker thread (they may touch the kernel or an agent), one evaluation at
a time: requests that arrive while one runs share its answer, so a flood of probes takes one thread, never the
pool the CSI calls run on.

Contract: :func:`serve_health` listens on ``HOST:PORT`` until ``stop`` is set; requests larger than 8 KiB or
slower than 5 s are dropped. It reads nothing from a request but its first line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from nvmeof_csi.rpc.endpoints import parse_listen
from nvmeof_csi.service.contracts import Health

log = logging.getLogger(__name__)
READ_TIMEOUT = 5.0


def _status(checks: Sequence[Callable[[], Health]]) -> tuple[int, str]:
    failing = [h.message for h in (check() for check in checks) if not h.ready]
    return (503, "; ".join(failing)) if failing else (200, "ok")


class SharedStatus:
    """The checks' status: one evaluation at a time, shared by every request that arrives while it runs."""

    def __init__(self, checks: Sequence[Callable[[], Health]]) -> None:
        self._checks = checks
        self._running: asyncio.Future[tuple[int, str]] | None = None
        self.evaluations = 0

    def _done(self, _: object) -> None:
        self._running = None

    async def get(self) -> tuple[int, str]:
        if self._running is None:
            self.evaluations += 1
            self._running = asyncio.ensure_future(asyncio.to_thread(_status, self._checks))
            self._running.add_done_callback(self._done)
        return await asyncio.shield(self._running)


async def serve_health(
    listen: str, checks: Sequence[Callable[[], Health]], stop: asyncio.Event, shared: SharedStatus | None = None
) -> None:
    host, port = parse_listen(listen)
    status = shared or SharedStatus(checks)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
            parts = line.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] in ("GET", "HEAD") and parts[1] == "/healthz":
                code, body = await status.get()
            elif len(parts) >= 2 and parts[0] in ("GET", "HEAD") and parts[1] == "/livez":
                code, body = 200, "alive"
            else:
                code, body = 404, "not found"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
            payload = (body + "\n").encode()
            writer.write(
                f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(payload)}"
                "\r\nConnection: close\r\n\r\n".encode()
                + (payload if parts[:1] != ["HEAD"] else b"")
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(answer, host, port, limit=8192)
    log.info("health endpoint on http://%s/healthz (readiness) and /livez (liveness)", listen)
    async with server:
        await stop.wait()
