"""``nvmeofctl snapshots``: list, create and delete snapshots (reflinks of a volume's backing file)."""

from __future__ import annotations

from typing import Annotated

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import as_dict, human_bytes, render

app = typer.Typer(help="Snapshots of volumes.", no_args_is_help=True)
COLUMNS = ("target", "uuid", "name", "source_volume_uuid", "size", "ready")
Target = Annotated[str | None, typer.Option("--target", "-t", help="Target holding the volume.")]


@app.command("list")
def list_snapshots(
    ctx: typer.Context,
    volume: Annotated[str, typer.Option(help="Only snapshots of this volume UUID.")] = "",
    target: Target = None,
) -> None:
    """Snapshots on every (or one) target."""
    cli = state(ctx)
    rows = []
    for t in cli.pick(target):
        with cli.client(t) as client:
            for snap in client.list_snapshots(source_volume=volume):
                rows.append({"target": t.name, **as_dict(snap), "size": human_bytes(snap.size_bytes)})
    render(rows, COLUMNS, cli.output, title="snapshots")


@app.command()
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Snapshot name (idempotency key).")],
    volume: Annotated[str, typer.Option(help="Source volume: its CSI handle, UUID or CSI name.")],
    target: Target = None,
) -> None:
    """Snapshot VOLUME as NAME (instant on XFS with reflink)."""
    cli = state(ctx)
    t, source = cli.locate(volume, target)
    with cli.client(t) as client:
        snap = client.create_snapshot(name, source)
    render([{"target": t.name, **as_dict(snap), "size": human_bytes(snap.size_bytes)}], COLUMNS, cli.output)


@app.command()
def delete(
    ctx: typer.Context, snapshot: Annotated[str, typer.Argument(help="Snapshot UUID.")], target: Target = None
) -> None:
    """Delete a snapshot (volumes cloned from it are not affected)."""
    cli = state(ctx)
    with cli.client(cli.one(target)) as client:
        client.delete_snapshot(snapshot)
    typer.echo(f"snapshot {snapshot} deleted")
