"""``nvmeofctl storage drain``: hand a storage node's replicated volumes over to their peers before maintenance;
``nvmeofctl storage doctor``: is this storage node ready for them (``cli/storage_doctor.py``)?

The command marks the node's agent draining (``SetDraining``, admin only; the mark survives the agent's restart);
the controller's failover pass then moves each volume the node is primary for to its peer in a planned switchover
(the peer in sync: the host's I/O stalls for the hand-over, it never fails). ``--wait`` follows the moves until
the node is primary for none, printing each change; it exits 1 naming what is left when the time runs out (a
peer out of sync or unreachable, or no controller running with ``--replica-records``). ``--undo`` clears the
mark (nothing moves back by itself).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.doctor import report_checks
from nvmeof_csi.cli.storage_doctor import AGENT_HELPER, StorageRoots, diagnose_storage
from nvmeof_csi.cli.volumes import replica_line
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.host.executor import SubprocessExecutor

app = typer.Typer(
    help="Storage nodes: move replicated volumes off a node; check a node for them.", no_args_is_help=True
)
PRIMARY = "primary"


def still_primary(volumes: list[pb.Volume]) -> dict[str, str]:
    """The replicated volumes this node still serves: UUID -> the replica's state in a line."""
    return {v.uuid: replica_line(v.replica) for v in volumes if v.HasField("replica") and v.replica.role == PRIMARY}


def follow(
    listing: Callable[[], list[pb.Volume]],
    wait: float,
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, str]:
    """Poll ``listing`` until no replicated volume is primary here or ``wait`` seconds passed; says each count
    that changed. Returns what is still primary (empty: drained)."""
    deadline, said = clock() + wait, -1
    while True:
        left = still_primary(listing())
        if len(left) != said:
            say(f"{len(left)} replicated volume(s) still primary here")
            said = len(left)
        if not left or clock() >= deadline:
            return left
        sleep(1.0)


@app.command()
def drain(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="The storage node's agent (its name in the targets file).")],
    wait: Annotated[
        float, typer.Option(help="Seconds to follow the moves until the node is primary for nothing (0: do not wait).")
    ] = 0.0,
    undo: Annotated[bool, typer.Option("--undo", help="Clear the mark: the node may be primary again.")] = False,
) -> None:
    """Mark TARGET draining: the controller switches every replicated volume TARGET is primary for to its peer."""
    if not math.isfinite(wait) or wait < 0:
        raise typer.BadParameter("must be a finite number of seconds, 0 or more", param_hint="'--wait'")
    cli = state(ctx)
    chosen = cli.one(target)
    with cli.client(chosen) as client:
        health = client.set_draining(not undo)
        typer.echo(f"{chosen.name}: {'draining' if health.draining else 'not draining'}")
        if undo or wait <= 0:
            return
        left = follow(client.list_volumes, wait, lambda line: typer.echo(f"{chosen.name}: {line}"))
    if left:
        for uuid, line in sorted(left.items()):
            typer.echo(f"{chosen.name}: volume {uuid} stayed: {line}", err=True)
        typer.echo(
            f"nvmeofctl: {chosen.name} is still primary for {len(left)} volume(s) after {wait:.0f} s: is the "
            "controller running with --replica-records, and are their peers in sync?",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"{chosen.name}: drained: it serves no replicated volume")


@app.command()
def doctor(
    ctx: typer.Context,
    helper: Annotated[
        str, typer.Option(help="The agent's DRBD helper (its --drbd-helper-dir and the script in it).")
    ] = AGENT_HELPER,
    root: Annotated[Path, typer.Option(hidden=True)] = Path("/"),
) -> None:
    """Check this storage node for replicated volumes: the kernel's DRBD 8.4, drbd-utils, DRBD's helper pointing
    at the agent, and a controller-ID window of its own on every replicated subsystem. Run it where the agent
    runs (its pod); prints each check with the fix; exits 1 when any check fails."""
    roots = StorageRoots(root / "proc", root / "sys", root / "sys/kernel/config", root / "usr/lib/drbd")
    report_checks(ctx, diagnose_storage(SubprocessExecutor(), roots, helper), "nvmeofctl storage doctor")
