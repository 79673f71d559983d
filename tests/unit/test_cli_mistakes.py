"""``nvmeofctl`` in an incident: every command, given a common mistake, answers with one line naming it and a
non-zero code, never a traceback or a usage box (an unknown option, a missing argument, an agent that is not
there, a file that does not exist); and the global options may come after the command."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer.main

from nvmeof_csi.cli.main import app, hoist_globals, run

NOWHERE = ["--agent", "unix:///nonexistent/agent.sock", "--timeout", "1"]


def leaves() -> Iterator[tuple[list[str], list[str]]]:
    """(command path, its required parameters: an argument's name, or an option's flag) of every command."""

    def walk(cmd: object, path: list[str]) -> Iterator[tuple[list[str], list[str]]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from walk(sub, [*path, name])
        else:
            params = [p for p in getattr(cmd, "params", []) if p.required and p.name]
            yield path, [p.opts[0] if p.opts[0].startswith("-") else p.name for p in params]

    yield from walk(typer.main.get_command(app), [])


LEAVES = sorted(leaves())


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = run(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvmeofctl: "), (argv, captured.err)
    assert "Traceback" not in captured.err + captured.out and "╭" not in captured.err, (argv, captured.err)
    return code, lines[0]


@pytest.mark.parametrize(("path", "required"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_names_a_usage_mistake_in_one_line(
    path: list[str], required: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, line = one_line(capsys, [*path, "--no-such-option"])
    assert code == 2 and "No such option: --no-such-option" in line and f"{' '.join(path)} --help" in line
    if required:
        code, line = one_line(capsys, path)
        assert code == 2 and "Missing" in line, line


AGENT_COMMANDS = [(p, r) for p, r in LEAVES if p[0] in ("volumes", "hosts", "portals", "ana", "snapshots")]


@pytest.mark.parametrize(("path", "required"), AGENT_COMMANDS, ids=[" ".join(p) for p, _ in AGENT_COMMANDS])
def test_every_agent_command_says_in_one_line_that_the_agent_is_not_there(
    path: list[str], required: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    values = {
        "ana_state": "optimized",
        "host_nqn": "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-00000000000a",
    }
    args: list[str] = []
    for name in required:
        value = values.get(name, "00000000-0000-4000-8000-000000000001")
        args += [name, value] if name.startswith("-") else [value]
    code, line = one_line(capsys, [*NOWHERE, *path, *args])
    assert code == 1 and ("nonexistent" in line or "not" in line), line


def test_a_file_that_is_not_there_is_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    nqn = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-00000000000a"
    code, line = one_line(capsys, [*NOWHERE, "hosts", "allow", "v", nqn, "--secret-file", "/nonexistent/key"])
    assert code == 1 and line == "nvmeofctl: /nonexistent/key: No such file or directory"  # before: a traceback


def test_global_options_may_come_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert hoist_globals(["volumes", "list", "-o", "json", "--timeout=3"]) == [
        "-o", "json", "--timeout=3", "volumes", "list"
    ]  # fmt: skip
    assert hoist_globals(["-ojson", "volumes", "show", "x", "--agent", "unix:///a"]) == [
        "--agent", "unix:///a", "-ojson", "volumes", "show", "x"
    ]  # fmt: skip
    assert hoist_globals(["driver", "info", "-o", "json"]) == ["driver", "info", "-o", "json"]  # its own -o
    assert hoist_globals(["volumes", "show", "--", "-o"]) == ["volumes", "show", "--", "-o"]
    code, line = one_line(capsys, ["volumes", "list", "-o", "json", *NOWHERE])  # before: "No such option: -o"
    assert code == 1 and "No such option" not in line
