"""Rendering rows as a rich table, JSON or YAML (``-o``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import typer
import yaml
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nvmeof_csi.cli.context import Output


def as_dict(msg: Message) -> dict[str, Any]:
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def human_bytes(value: int | str) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def render(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], output: Output, title: str = "") -> None:
    if output is Output.JSON:
        typer.echo(json.dumps(list(rows), indent=1, sort_keys=True))
        return
    if output is Output.YAML:
        typer.echo(yaml.safe_dump(list(rows), sort_keys=True).rstrip())
        return
    table = Table(title=Text(title) if title else None)
    for column in columns:
        table.add_column(Text(column))
    for row in rows:  # Text: a server string is shown as it is, never read as rich markup
        table.add_row(*(Text(_cell(row.get(c, ""))) for c in columns))
    Console().print(table)
