"""nvmeofctl against hostile or careless input. Server strings reach the terminal as they are: an NQN or a
message holding ``[`` and ``]`` (a node chooses its own NQN) is printed literally by tables and ``trace``, never
read as rich markup (before, ``[/]`` raised a MarkupError and ``[bold red]`` restyled the rest of the line); a host
key is never sent over plaintext TCP."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from nvmeof_csi.cli import output
from nvmeof_csi.cli.context import Output
from nvmeof_csi.cli.main import app as nvmeofctl
from nvmeof_csi.cli.output import render
from nvmeof_csi.cli.trace import _tree

HOSTILE = "nqn.2014-08.org.evil:[/][bold red]host[/bold red][link=http://x]y"


def test_a_table_shows_markup_in_a_server_string_literally(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "Console", lambda: Console(width=400, color_system=None))
    render([{"host_nqn": HOSTILE, "access": "[red]fenced"}], ("host_nqn", "access"), Output.TABLE)
    shown = capsys.readouterr().out
    assert HOSTILE in shown and "[red]fenced" in shown


def test_trace_shows_markup_in_server_strings_literally() -> None:
    doc = {"uuid": "u", "name": "[/]", "agent": "a[b]", "nqn": HOSTILE, "namespace_uuid": "n", "status": "ready",
           "allowed_hosts": [HOSTILE], "health": [{"status": "degraded", "reason": "[x]", "message": "[/]"}]}  # fmt: skip
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(_tree(doc))
    shown = buf.getvalue()
    assert shown.count(HOSTILE) == 2 and "a[b]" in shown and "degraded [x]: [/]" in shown


def test_a_host_key_is_never_sent_in_plaintext(tmp_path: Path) -> None:
    """Before, ``--agent tcp://127.0.0.1:PORT`` went plaintext silently, also with a DH-HMAC-CHAP key."""
    key = tmp_path / "key"
    key.write_text("DHHC-1:00:" + "A" * 48 + ":")
    argv = ["--agent", "tcp://127.0.0.1:9", "hosts", "allow", "u", "nqn.2014-08.org.nvmexpress:uuid:x", "--secret-file"]
    result = CliRunner().invoke(nvmeofctl, [*argv, str(key)])
    assert result.exit_code == 2 and "never sent in plaintext" in result.output, result.output
