"""``nvmeofctl portals`` and ``nvmeofctl ana``: portals, portal groups and their ANA states."""

from __future__ import annotations

from typing import Annotated

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import as_dict, render
from nvmeof_csi.nvmeof.context import ANA_STATES

portals_app = typer.Typer(help="Show the agents' portals.", no_args_is_help=True)
ana_app = typer.Typer(help="Planned failover: set a portal group's ANA state.", no_args_is_help=True)
COLUMNS = ("target", "port_id", "trtype", "traddr", "trsvcid", "group", "ana_state")
Target = Annotated[str | None, typer.Option("--target", "-t", help="Only this target.")]


@portals_app.command("list")
def list_portals(ctx: typer.Context, target: Target = None) -> None:
    """Every portal: transport, address, portal group and ANA state."""
    cli = state(ctx)
    rows = []
    for t in cli.pick(target):
        with cli.client(t) as client:
            rows += [{"target": t.name, **as_dict(p)} for p in client.list_portals()]
    render(rows, COLUMNS, cli.output, title="portals")


@ana_app.command("set")
def set_ana(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Portal group, as in the agent's --portal ...:GROUP.")],
    ana_state: Annotated[str, typer.Argument(metavar="STATE", help="optimized | non-optimized | inaccessible")],
    target: Target = None,
) -> None:
    """Set the ANA state of every portal in GROUP; connected hosts see it at once and move I/O."""
    if ana_state not in ANA_STATES:
        raise typer.BadParameter(f"must be one of {', '.join(ANA_STATES)}", param_hint="STATE")
    cli = state(ctx)
    t = cli.one(target)
    with cli.client(t) as client:
        portals = client.set_ana(group, ana_state)
    render([{"target": t.name, **as_dict(p)} for p in portals], COLUMNS, cli.output, title=f"{group} -> {ana_state}")
