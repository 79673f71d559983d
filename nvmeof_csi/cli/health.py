"""``nvmeofctl targets`` and ``nvmeofctl health``: which agents exist and whether they are ready."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import human_bytes, render
from nvmeof_csi.errors import DriverError


def targets(ctx: typer.Context) -> None:
    """The configured agents and how to reach them."""
    cli = state(ctx)
    rows = [{"name": t.name, "endpoint": str(t.endpoint), "tls": "mTLS" if t.tls else "none"} for t in cli.pick(None)]
    render(rows, ("name", "endpoint", "tls"), cli.output, title="targets")


def health(
    ctx: typer.Context, target: Annotated[str | None, typer.Option("--target", "-t", help="Only this target.")] = None
) -> None:
    """Readiness, version, capacity and unknown objects of each agent; exits 1 if any agent is not ready."""
    cli = state(ctx)
    rows: list[dict[str, Any]] = []
    for t in cli.pick(target):
        try:
            with cli.client(t) as client:
                h = client.health()
                pools = client.capacity()
            rows.append(
                {
                    "target": t.name,
                    "ready": h.ready,
                    "message": h.message,
                    "version": h.version,
                    "free": ", ".join(human_bytes(p.free_bytes) for p in pools),
                    "provisioned": ", ".join(human_bytes(p.provisioned_bytes) for p in pools),
                    "unknown_objects": list(h.unknown_objects),
                }
            )
        except DriverError as err:
            rows.append({"target": t.name, "ready": False, "message": str(err)})
    render(rows, ("target", "ready", "message", "version", "free", "provisioned", "unknown_objects"), cli.output)
    if not all(r["ready"] for r in rows):
        raise typer.Exit(1)
