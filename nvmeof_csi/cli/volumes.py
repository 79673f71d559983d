"""``nvmeofctl volumes``: list and show volumes on the agents."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import as_dict, human_bytes, render

app = typer.Typer(help="List and inspect volumes on the target agents.", no_args_is_help=True)
COLUMNS = ("target", "uuid", "name", "size", "status", "allowed_hosts", "nqn")
Target = Annotated[str | None, typer.Option("--target", "-t", help="Only this target (name from the targets file).")]


def _row(target: str, volume: Any) -> dict[str, Any]:
    row = as_dict(volume)
    row["target"] = target
    row["size"] = human_bytes(volume.capacity_bytes)
    return row


@app.command("list")
def list_volumes(ctx: typer.Context, target: Target = None) -> None:
    """Every volume on every (or one) target: UUID, CSI name, size, status, allowed hosts, NQN."""
    cli = state(ctx)
    rows = []
    for t in cli.pick(target):
        with cli.client(t) as client:
            rows += [_row(t.name, v) for v in client.list_volumes()]
    render(rows, COLUMNS, cli.output, title="volumes")


@app.command()
def show(
    ctx: typer.Context,
    volume: Annotated[str, typer.Argument(help="Volume: CSI handle (nvmeof-v1.AGENT.UUID), UUID or CSI name.")],
    target: Target = None,
) -> None:
    """One volume in full (portals and their ANA states included)."""
    cli = state(ctx)
    chosen, vol_uuid = cli.locate(volume, target)
    with cli.client(chosen) as client:
        found = client.get_volume(vol_uuid=vol_uuid)
    row = _row(chosen.name, found)
    render([row], [*COLUMNS, "namespace_uuid", "portals", "parameters", "labels"], cli.output, title=volume)
