"""What every long-running command shares: settings errors exit 2, runtime domain errors exit 1, each with
one line on stderr naming the program."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import typer

from nvmeof_csi.errors import ConfigError, DriverError, InvalidArgument

T = TypeVar("T")


def settings_or_exit(prog: str, build: Callable[[], T]) -> T:
    try:
        return build()
    except (ConfigError, InvalidArgument, TypeError) as err:
        typer.echo(f"{prog}: invalid setting: {err}", err=True)
        raise typer.Exit(2) from err


def run_or_exit(prog: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        asyncio.run(main())
    except ConfigError as err:
        typer.echo(f"{prog}: invalid setting: {err}", err=True)
        raise typer.Exit(2) from err
    except DriverError as err:
        typer.echo(f"{prog}: {err}", err=True)
        raise typer.Exit(1) from err
