"""``nvmeofctl``: the admin CLI. Command groups live in their own modules; this one wires them together.

Errors are one line on stderr with a non-zero exit code; every command has ``--help``.
"""

from __future__ import annotations

import typer

from nvmeof_csi import DRIVER_NAME, __version__
from nvmeof_csi.cli import driver

app = typer.Typer(
    help="Administer nvmeof-csi: inspect a running driver (target commands arrive with the target agent).",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(driver.app, name="driver")


@app.command()
def version() -> None:
    """Print the CLI's driver name and version."""
    typer.echo(f"{DRIVER_NAME} {__version__}")


if __name__ == "__main__":
    app()
