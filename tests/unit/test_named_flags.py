"""Every ``--flag`` the docs, the README and the alert rules name is a flag of ours (``nvmeof-csi`` serve, agent
and its other commands, or ``nvmeofctl``) or of a tool the text names beside it (listed here with that tool).
Before: an alert told operators to lower the agent's ``--capacity-bytes``, a flag that never existed."""

from __future__ import annotations

import re

import typer
import typer.main

from nvmeof_csi.cli.main import app as nvmeofctl
from nvmeof_csi.cmd.main import app as nvmeof_csi
from tests.support.env import ROOT

#: flags of other tools the texts show in their commands, with the tool
FOREIGN = {
    "--bounding-set": "setpriv", "--build-arg": "docker build", "--cert": "kubectl create secret tls",
    "--key": "kubectl create secret tls", "--check": "ruff format", "--csi": "csi-sanity (--csi.*)",
    "--extra-create-metadata": "csi-provisioner", "--kube-api-burst": "the CSI sidecars",
    "--kube-api-qps": "the CSI sidecars", "--from-file": "kubectl create", "--help": "every command",
    "--namespace": "kubectl, helm", "--node-monitor-grace-period": "kube-controller-manager",
    "--overwrite": "kubectl label", "--server-side": "kubectl apply", "--strict": "helm lint, mypy",
    "--values": "helm", "--wait": "helm, kubectl", "--tos": "ss", "--tls-": "a prefix (--tls-cert, ...)",
    "--kernel": "python -m lab", "--lab": "python -m bench", "--levels": "python -m bench",
    "--profile": "python -m bench", "--quick": "python -m bench", "--repeats": "python -m bench",
    "--samples": "python -m bench", "--smoke": "python -m bench", "--discard-my-data": "drbdadm connect",
}  # fmt: skip
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
TEXTS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "deploy" / "prometheus" / "alerts.yaml"]


def flags_of(app: typer.Typer) -> set[str]:
    found: set[str] = set()

    def walk(cmd: object) -> None:
        for param in getattr(cmd, "params", []):
            found.update(o for o in [*param.opts, *getattr(param, "secondary_opts", [])] if o.startswith("--"))
        for sub in (getattr(cmd, "commands", None) or {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return found


def test_every_flag_the_docs_and_alerts_name_exists() -> None:
    ours = flags_of(nvmeof_csi) | flags_of(nvmeofctl)
    unknown = {
        f"{text.relative_to(ROOT)}: {flag}"
        for text in TEXTS
        for flag in FLAG.findall(text.read_text())
        if flag not in ours and flag not in FOREIGN
    }
    assert not unknown, f"flags named in the texts that no command has: {sorted(unknown)}"
    assert "--capacity-limit" in ours and "--capacity-bytes" not in ours
