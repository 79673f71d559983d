"""``nvmeofctl``: the admin CLI for target agents (and a driver's CSI socket).

One error boundary: a domain error or a bad configuration prints one line on stderr and exits 1 (usage
errors exit 2); every command explains itself with ``--help``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi import DRIVER_NAME, __version__
from nvmeof_csi.cli import datasets, doctor, driver, health, hosts, portals, snapshots, trace, volumes
from nvmeof_csi.cli.context import CliState, Output, load_targets
from nvmeof_csi.errors import ConfigError, DriverError

app = typer.Typer(
    help="Administer nvmeof-csi target agents: volumes, hosts, portals, ANA, snapshots, health.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(volumes.app, name="volumes")
app.add_typer(hosts.app, name="hosts")
app.add_typer(portals.portals_app, name="portals")
app.add_typer(portals.ana_app, name="ana")
app.add_typer(snapshots.app, name="snapshots")
app.add_typer(driver.app, name="driver")
app.add_typer(datasets.app, name="datasets")
app.command("targets")(health.targets)
app.command("health")(health.health)
app.command("doctor")(doctor.doctor)
app.command("trace")(trace.trace)


@app.callback()
def common(
    ctx: typer.Context,
    targets: Annotated[
        Path | None, typer.Option(envvar="NVMEOFCTL_TARGETS", help="YAML file listing agents (see docs).")
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(envvar="NVMEOFCTL_AGENT", help="One agent endpoint, e.g. unix:///run/nvmeof-csi/agent.sock"),
    ] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="table, json or yaml.")] = Output.TABLE,
    timeout: Annotated[float, typer.Option(help="Seconds per RPC.")] = 30.0,
) -> None:
    """Global options; the targets are loaded lazily by the commands that need them."""
    ctx.obj = CliState(output=output, timeout=timeout)
    if ctx.invoked_subcommand not in ("version", "driver", "doctor"):
        ctx.obj.targets = load_targets(targets, agent)


@app.command()
def version() -> None:
    """Print the CLI's driver name and version."""
    typer.echo(f"{DRIVER_NAME} {__version__}")


def main() -> None:
    """Console-script entry point with the CLI's error boundary."""
    try:
        app()  # usage errors: typer prints them and exits 2
    except (DriverError, ConfigError) as err:
        typer.echo(f"nvmeofctl: {err}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
