"""``nvmeofctl hosts``: allow, deny, list, fence and unfence host NQNs on a volume; rotate a host's keys."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi.cli.context import parse_volume, state
from nvmeof_csi.cli.output import as_dict, render

app = typer.Typer(help="Grant, revoke, list, fence and unfence hosts of a volume's subsystem.", no_args_is_help=True)
Volume = Annotated[
    str, typer.Argument(help="Volume: its CSI handle (nvmeof-v1.AGENT.UUID), UUID or CSI name (pvc-...).")
]
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
    plain = [t for t in cli.pick(parse_volume(volume)[0] or target) if t.endpoint.scheme == "tcp" and t.tls is None]
    if secret and plain:  # refused before the volume is even looked for
        typer.echo(
            f"nvmeofctl: a DH-HMAC-CHAP key is never sent in plaintext ({plain[0].endpoint}): use the agent's unix "
            "socket, or a --targets entry with tls",
            err=True,
        )
        raise typer.Exit(2)
    chosen, volume = cli.locate(volume, target)
    with cli.client(chosen) as client:
        vol = client.allow_host(volume, host_nqn, secret)
    render([as_dict(vol)], ("uuid", "name", "allowed_hosts"), cli.output)


@app.command()
def deny(ctx: typer.Context, volume: Volume, host_nqn: HostNqn, target: Target = None) -> None:
    """Remove HOST_NQN from VOLUME's allow-list (new connections are refused)."""
    cli = state(ctx)
    chosen, volume = cli.locate(volume, target)
    with cli.client(chosen) as client:
        vol = client.deny_host(volume, host_nqn)
    render([as_dict(vol)], ("uuid", "name", "allowed_hosts"), cli.output)


@app.command("rotate-key")
def rotate_key(
    ctx: typer.Context,
    host_nqn: HostNqn,
    controller: Annotated[
        bool, typer.Option("--controller", help="Rotate the bidirectional controller key instead of the host's key.")
    ] = False,
    target: Target = None,
) -> None:
    """Issue HOST_NQN a new random DH-HMAC-CHAP key on the target, on every volume that allows it. Its node
    writes the key to its live controllers at its next pass (--qos-period), and they re-authenticate without
    dropping I/O. Rotate the controller key in a second call (one changed key per re-authentication)."""
    cli = state(ctx)
    with cli.client(cli.one(target)) as client:
        done = client.rotate_host_key(host_nqn, controller)
    render([{"host_nqn": host_nqn, "key": "controller" if controller else "host", "volumes": len(done)}],
           ("host_nqn", "key", "volumes"), cli.output)  # fmt: skip


@app.command("list")
def list_hosts(ctx: typer.Context, volume: Volume, target: Target = None) -> None:
    """Every host of VOLUME: allowed (read-write or read-only) or fenced (with the reason, the time and whether
    its connections were ended yet)."""
    cli = state(ctx)
    chosen, volume = cli.locate(volume, target)
    with cli.client(chosen) as client:
        vol = client.get_volume(volume)
    rows: list[dict[str, str]] = [
        {"host_nqn": h, "access": "read-only" if h in vol.readonly_hosts else "read-write", "reason": "", "since": ""}
        for h in vol.allowed_hosts
    ]
    for f in vol.fenced_hosts:
        since = datetime.fromtimestamp(f.fenced_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        rows.append(
            {"host_nqn": f.host_nqn, "access": "fenced" if f.done else "fencing", "reason": f.reason, "since": since}
        )
    render(rows, ("host_nqn", "access", "reason", "since"), cli.output)


@app.command()
def fence(ctx: typer.Context, volume: Volume, host_nqn: HostNqn, target: Target = None) -> None:
    """Fence HOST_NQN from VOLUME now: refused from now on and every connection it has to the volume ended (the
    volume's other hosts reconnect). It stays refused until `hosts unfence`."""
    cli = state(ctx)
    chosen, volume = cli.locate(volume, target)
    with cli.client(chosen) as client:
        vol = client.fence_host(volume, host_nqn, "OPERATOR")
    render([as_dict(vol)], ("uuid", "name", "allowed_hosts", "fenced_hosts"), cli.output)


@app.command()
def unfence(ctx: typer.Context, volume: Volume, host_nqn: HostNqn, target: Target = None) -> None:
    """Lift HOST_NQN's fence on VOLUME so that it may be published to again. Only after its node was powered
    off or rebooted: a node that was cut off but kept running may still hold writes in its page cache."""
    cli = state(ctx)
    chosen, volume = cli.locate(volume, target)
    with cli.client(chosen) as client:
        vol = client.unfence_host(volume, host_nqn)
    render([as_dict(vol)], ("uuid", "name", "allowed_hosts", "fenced_hosts"), cli.output)
