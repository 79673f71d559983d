"""Contextual logging: request ID and volume ID live in contextvars and appear on every log line.

``install(level)`` configures the root logger once, from ``main`` only. The filter is stateless; the
contextvars are set by the RPC edge for the duration of one call (asyncio tasks and ``to_thread`` copy them).
"""

from __future__ import annotations

import contextvars
import logging
import sys

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
volume_id: contextvars.ContextVar[str] = contextvars.ContextVar("volume_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s req=%(request_id)s vol=%(volume_id)s %(message)s"


class ContextFilter(logging.Filter):
    """Adds ``request_id`` and ``volume_id`` attributes to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.volume_id = volume_id.get()
        return True


def install(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
