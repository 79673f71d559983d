"""Log lines: request values cannot forge a line; our formatter writes the standard time text and formats its
arguments once. (The first a security review found; it failed before its fix.)"""

from __future__ import annotations

import io
import logging

from nvmeof_csi.rpc import logctx


def test_request_values_cannot_forge_log_lines() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logctx.ContextFilter())
    log = logging.getLogger("test.forge")
    log.addHandler(handler)
    log.propagate = False
    log.warning("volume %s deleted", "pvc-1\n2026-11-30 INFO nvmeof_csi forged line\x00")
    assert stream.getvalue().count("\n") == 1 and "\\n2026-11-30" in stream.getvalue()


def test_log_lines_keep_the_standard_time_text_and_format_their_arguments_once() -> None:
    class Counted:
        calls = 0

        def __str__(self) -> str:
            Counted.calls += 1
            return "pvc-1"

    ours, standard = logctx.Formatter(), logging.Formatter(logctx.FORMAT)
    for created in (1764633600.25, 1764633600.999, 1764633601.0, 1764633659.5):  # same second, then the next ones
        record = logging.LogRecord("nvmeof_csi.rpc", logging.INFO, __file__, 1, "volume %s deleted", (Counted(),), None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert logctx.ContextFilter().filter(record)
        line = ours.format(record)
        assert line == standard.format(record) and line.endswith("req=- vol=- volume pvc-1 deleted")
    assert Counted.calls == 4  # once per line, in the filter
