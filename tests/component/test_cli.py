"""nvmeofctl against a running (in-process) driver, and its one-line errors."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from nvmeof_csi.cli.main import app
from tests.support.stack import Stack


async def test_driver_info_json(stack: Stack) -> None:
    endpoint = f"unix://{stack.tmp / 'csi.sock'}"
    result = await asyncio.to_thread(CliRunner().invoke, app, ["driver", "info", "--endpoint", endpoint, "-o", "json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)  # stderr may hold the in-process server's log lines
    assert facts["name"] == "csi.nvmeof.io" and facts["ready"] is True
    assert "CREATE_DELETE_VOLUME" in facts["controller_capabilities"]
    assert facts["node_id"] == "node-1"


def test_bad_endpoint_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(app, ["driver", "info", "--endpoint", "http://x"])
    assert result.exit_code == 2
    assert "endpoint" in result.output and len(result.output.strip().splitlines()) == 1


def test_unreachable_driver_exit_1(tmp_path: object) -> None:
    result = CliRunner().invoke(app, ["driver", "info", "--endpoint", "unix:///nonexistent/csi.sock", "--timeout", "1"])
    assert result.exit_code == 1 and "UNAVAILABLE" in result.output
