"""Server strings reach the terminal as they are: an NQN or a message that holds ``[`` and ``]`` (a node chooses its
own NQN) is printed literally by ``nvmeofctl`` tables and ``trace``, never read as rich markup. Before, ``[/]``
raised a MarkupError and ``[bold red]`` restyled (or hid) the rest of the line."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from nvmeof_csi.cli import output
from nvmeof_csi.cli.context import Output
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
