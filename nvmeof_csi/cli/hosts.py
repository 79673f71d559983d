"""``nvmeofctl hosts``: allow or deny a host NQN on a volume."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import as_dict, render

app = typer.Typer(help="Grant or revoke a host's access to a volume's subsystem.", no_args_is_help=True)
Volume = Annotated[str, typer.Argument(help="Volume UUID.")]
HostNqn = Annotated[str, typer.Argument(help="Host NQN, e.g. nqn.2014-08.org.nvmexpress:uuid:...")]
Target = Annotated[str | None, typer.Option("--target", "-t", help="Target holding the volume.")]


@app.command()
def allow(
    ctx: typer.Context,
    volume: Volume,
    host_nqn: HostNqn,
    secret_file: Annotated[
        Path | None, typer.Option(help="File holding a DH-HMAC-CHAP key (kept out of argv and shell history).")
    ] = None,
    target: Target = None,
) -> None:
    """Allow HOST_NQN to connect to VOLUME (optionally with a DH-HMAC-CHAP secret)."""
    cli = state(ctx)
    secret = secret_file.read_text().strip() if secret_file else ""
    with cli.client(cli.one(target)) as client:
        vol = client.allow_host(volume, host_nqn, secret)
    render([as_dict(vol)], ("uuid", "name", "allowed_hosts"), cli.output)


@app.command()
def deny(ctx: typer.Context, volume: Volume, host_nqn: HostNqn, target: Target = None) -> None:
    """Remove HOST_NQN from VOLUME's allow-list (new connections are refused)."""
    cli = state(ctx)
    with cli.client(cli.one(target)) as client:
        vol = client.deny_host(volume, host_nqn)
    render([as_dict(vol)], ("uuid", "name", "allowed_hosts"), cli.output)
