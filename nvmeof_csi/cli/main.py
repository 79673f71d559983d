"""``nvmeofctl``: the admin CLI for target agents (and a driver's CSI socket).

One error boundary (:func:`run`): a domain error, a bad configuration or a file that cannot be read prints one
line on stderr and exits 1; a usage mistake (an unknown option, a missing argument, a bad value) prints one line
naming the mistake and the ``--help`` to read, and exits 2. The global options (``-o/--output``, ``--timeout``,
``--targets``, ``--agent``) may also come after the command (:func:`hoist_globals`). Every command explains
itself with ``--help``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi import DRIVER_NAME, __version__
from nvmeof_csi.cli import datasets, doctor, driver, health, hosts, portals, snapshots, storage, trace, volumes
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
app.add_typer(storage.app, name="storage")
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


#: the global options that take a value; ``driver`` has options of these names of its own
GLOBAL_VALUED = frozenset({"-o", "--output", "--timeout", "--targets", "--agent"})


def hoist_globals(argv: Sequence[str]) -> list[str]:
    """``argv`` with the global options given after the command moved before it (``nvmeofctl volumes list -o
    json`` as ``nvmeofctl -o json volumes list``); ``driver``'s arguments, and anything after ``--``, stay."""
    words = list(argv)
    at = next(
        (i for i, w in enumerate(words) if not w.startswith("-") and (i == 0 or words[i - 1] not in GLOBAL_VALUED)),
        None,
    )
    if at is None or words[at] == "driver":
        return words
    moved: list[str] = []
    kept: list[str] = []
    rest = words[at + 1 :]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            kept += rest[i:]
            break
        if (word.split("=", 1)[0] in GLOBAL_VALUED and "=" in word) or (word.startswith("-o") and len(word) > 2):
            moved.append(word)
        elif word in GLOBAL_VALUED and i + 1 < len(rest):
            moved += [word, rest[i + 1]]
            i += 1
        else:
            kept.append(word)
        i += 1
    return [*moved, *words[: at + 1], *kept]


def run(argv: Sequence[str]) -> int:
    """Run ``nvmeofctl ARGV`` behind the CLI's error boundary; the exit code."""
    try:
        done = app(args=hoist_globals(argv), prog_name="nvmeofctl", standalone_mode=False)
    except typer.Exit as stop:
        return stop.exit_code
    except typer.Abort:
        typer.echo("nvmeofctl: aborted", err=True)
        return 1
    except typer.TyperException as mistake:  # click's usage errors, vendored by typer
        if type(mistake).__name__ != "NoArgsIsHelpError":  # that one has printed the command's help already
            ctx = getattr(mistake, "ctx", None)
            where = ctx.command_path if ctx is not None else "nvmeofctl"
            typer.echo(f"nvmeofctl: {mistake.format_message()} (see: {where} --help)", err=True)
        return int(getattr(mistake, "exit_code", 2))
    except (DriverError, ConfigError) as err:
        typer.echo(f"nvmeofctl: {err}", err=True)
        return 1
    except OSError as err:  # a file named on the command line that cannot be read
        typer.echo(f"nvmeofctl: {err.filename or ''}: {err.strerror or err}".replace(": : ", ": "), err=True)
        return 1
    return done if isinstance(done, int) else 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
