"""Contextual logging: request ID and volume ID live in contextvars and appear on every log line.

``install(level)`` configures the root logger once, from ``main`` only. The filter is stateless; the
contextvars are set by the RPC edge for the duration of one call (asyncio tasks and ``to_thread`` copy them).
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import time

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
volume_id: contextvars.ContextVar[str] = contextvars.ContextVar("volume_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s req=%(request_id)s vol=%(volume_id)s %(message)s"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def escape(text: str) -> str:
    """One log line stays one line: newlines and other control characters from request values are escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text).replace("\n", "\\n")


class ContextFilter(logging.Filter):
    """Adds ``request_id`` and ``volume_id`` attributes to each record and escapes control characters in the
    message (request values cannot forge log lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = escape(request_id.get())
        record.volume_id = escape(volume_id.get())
        message = record.getMessage()  # formatted once here; the formatter then finds no arguments left
        if _CONTROL.search(message) or "\n" in message:
            message = escape(message)
        record.msg, record.args = message, ()
        return True


class Formatter(logging.Formatter):
    """``FORMAT`` with the time text made once per second (not once per line), milliseconds appended."""

    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        whole = int(record.created)
        second, text = self._second  # one tuple read and one write: threads never see a torn pair
        if second != whole:
            text = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(whole))
            self._second = (whole, text)
        return f"{text},{int(record.msecs):03d}"


def install(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Formatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
