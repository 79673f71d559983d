"""``nvmeofctl doctor``: run on a GPU node; is it ready for NVMe-oF volumes? (``initiator/doctor.py``)"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import render
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.keyring import handshake_daemon_running
from nvmeof_csi.initiator.doctor import Check, diagnose
from nvmeof_csi.initiator.fabrics import FabricsDevice
from nvmeof_csi.initiator.features import FEATURES, NodeFeatures


def doctor(
    ctx: typer.Context,
    peers: Annotated[
        Path | None,
        typer.Option(
            help="File with the host NQNs / host IDs of the other nodes (one per line): fail if this node shares one."
        ),
    ] = None,
    require_rdma: Annotated[bool, typer.Option(help="Fail when the node has no RDMA device.")] = False,
    sys_root: Annotated[Path, typer.Option(hidden=True)] = Path("/sys"),
    etc_nvme: Annotated[Path, typer.Option(hidden=True)] = Path("/etc/nvme"),
    cgroup_root: Annotated[Path, typer.Option(help="The cgroup v2 mount kubelet uses.")] = Path("/sys/fs/cgroup"),
    feature: Annotated[
        list[str] | None,
        typer.Option(
            help=f"A StorageClass feature this node must serve (repeatable; one of {', '.join(FEATURES)}): fail "
            "when it is missing. Every feature is listed either way."
        ),
    ] = None,
) -> None:
    """Check this node: fabrics modules, native multipath, host NQN / host ID, nvme-cli, RDMA devices, cgroup v2 io
    controller, and what each StorageClass feature needs (tcp, rdma, multipath, dhchap, qos). Prints each check
    with the fix; exits 1 when any check fails."""
    unknown = sorted(set(feature or ()) - set(FEATURES))
    if unknown:
        raise ConfigError(f"--feature {', '.join(unknown)}: not a feature (one of {', '.join(FEATURES)})")
    others: list[str] = []
    if peers is not None:
        try:
            others = peers.read_text().split()
        except OSError as exc:
            raise ConfigError(f"cannot read --peers {peers}: {exc.strerror}") from exc
    fabrics = FabricsDevice(sys_root=sys_root)
    features = NodeFeatures(
        sys_root,
        cgroup_root=cgroup_root,
        authenticates=fabrics.authenticates,
        tls_capable=lambda: "tls" in fabrics.options(),
        handshake_daemon=handshake_daemon_running,
    )
    checks = diagnose(
        SubprocessExecutor(), sys_root, etc_nvme, cgroup_root, others, require_rdma, features, feature or ()
    )
    report_checks(ctx, checks, "nvmeofctl doctor")


def report_checks(ctx: typer.Context, checks: list[Check], title: str) -> None:
    """Each check with its result and fix, in the chosen output; exit 1 naming the failed ones."""
    rows = [{**asdict(c), "result": "FAIL" if not c.ok else ("absent" if c.absent else "pass")} for c in checks]
    render(rows, ("name", "result", "detail", "fix"), state(ctx).output, title=title)
    failed = [c.name for c in checks if not c.ok]
    if failed:
        typer.echo(f"{len(failed)} check(s) failed: {', '.join(failed)}", err=True)
        raise typer.Exit(1)
