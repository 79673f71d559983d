"""``nvmeofctl volumes``: list and show volumes on the agents."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import as_dict, human_bytes, render
from nvmeof_csi.errors import DriverError

app = typer.Typer(help="List and inspect volumes on the target agents.", no_args_is_help=True)
COLUMNS = ("target", "uuid", "name", "size", "status", "allowed_hosts", "nqn")
Target = Annotated[str | None, typer.Option("--target", "-t", help="Only this target (name from the targets file).")]


def _row(target: str, volume: Any) -> dict[str, Any]:
    row = as_dict(volume)
    row["target"] = target
    row["size"] = human_bytes(volume.capacity_bytes)
    if volume.HasField("replica"):
        row["replica_state"] = replica_line(volume.replica)
    return row


def replica_line(r: Any) -> str:
    """One replica in a line: its role and epoch, DRBD's view (role, disks, connection, sync), its peer."""
    drbd = f"DRBD {r.drbd_role} {r.disk}/{r.peer_disk} {r.connection}" if r.drbd_role else "DRBD not up"
    sync = f", {r.synced_percent:.0f}% synced, {human_bytes(r.out_of_sync_bytes)} to copy" if r.synced_percent else ""
    return f"{r.role} (epoch {r.epoch}); {drbd}{sync}; peer {r.peer_agent}"


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
    """One volume in full (portals and their ANA states included); a replicated volume's other replica too, from
    its agent when the targets list it: each replica's role, DRBD disk states and sync progress."""
    cli = state(ctx)
    chosen, vol_uuid = cli.locate(volume, target)
    with cli.client(chosen) as client:
        found = client.get_volume(vol_uuid=vol_uuid)
    rows = [_row(chosen.name, found)]
    other = found.replica.peer_agent
    peer = next((t for t in cli.targets if t.name == other), None) if other else None
    if peer is not None:
        try:
            with cli.client(peer) as client:
                rows.append(_row(peer.name, client.get_volume(vol_uuid=vol_uuid)))
        except DriverError as err:
            rows.append({"target": peer.name, "uuid": vol_uuid, "replica_state": f"unreachable: {err}"})
    extra = ["replica_state"] if other else []
    render(rows, [*COLUMNS, *extra, "namespace_uuid", "portals", "parameters", "labels"], cli.output, title=volume)
