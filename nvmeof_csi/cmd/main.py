"""``nvmeof-csi``: the driver executable (``serve``, ``agent``, ``demo``, ``tlshd``, ``version``).

Flags can also be given as ``NVMEOF_CSI_<FLAG>`` environment variables (e.g. ``NVMEOF_CSI_ENDPOINT``).
Invalid settings exit with code 2 and one line naming the setting; runtime domain errors exit 1.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nvmeof_csi import DRIVER_NAME, __version__
from nvmeof_csi.cmd.agent import agent_command
from nvmeof_csi.cmd.demo import demo_command
from nvmeof_csi.cmd.serve import serve_command
from nvmeof_csi.cmd.tlshd import tlshd_command

app = typer.Typer(help=f"{DRIVER_NAME}: NVMe-over-Fabrics CSI driver.", no_args_is_help=True, add_completion=False)
app.command(name="serve")(serve_command)
app.command(name="agent")(agent_command)
app.command(name="demo")(demo_command)
app.command(name="tlshd")(tlshd_command)


@app.command()
def version() -> None:
    """Print the driver name and version."""
    typer.echo(f"{DRIVER_NAME} {__version__}")


def _print_version(value: bool) -> None:
    if value:
        version()
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """NVMe-over-Fabrics CSI driver: serve (controller/node), agent (storage node), demo."""


if __name__ == "__main__":
    app()
