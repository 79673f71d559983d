"""The Helm chart's own checks, beside the schema validation of everything it renders (``deploy/validate.py``).

- ``helm lint --strict`` with the default values and with each value set in the chart's ``ci/`` folder;
- each file of ``deploy/helm/bad-values`` (one mistake each) refused by the chart's ``values.schema.json``;
- the fabric map and the agents' client policy the chart renders parsed by the driver's own parsers (what the
  controller and the agent would do at start-up), for every value set that names agents;
- the listeners and NetworkPolicies of every value set (:mod:`chart_policy`), and extra arguments made of shell
  syntax rendered as whole arguments, never into a script;
- the sidecar image tags of ``values.yaml`` equal to the pins in ``versions.env`` (what the lab builds).

Contract: :func:`check_chart` prints one line per check and returns the problems found (empty: all passed);
:func:`render` returns the objects ``helm template`` renders for one value set, or exits naming the failure.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from chart_policy import (
    EXTRA_ARGS_VALUES,
    HOSTILE_ARGS,
    TLSHD_CAPABILITIES,
    host_network_problems,
    monitoring_problems,
    network_policy_problems,
    selected_jobs,
    shell_problems,
    tlshd_problems,
)

from nvmeof_csi.agent.authz import parse_policy
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.topology.fabric_map import parse_fabric_map

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "nvmeof-csi"
BAD_VALUES = ROOT / "deploy" / "helm" / "bad-values"
MONITORING = (ROOT / "deploy" / "prometheus" / "alerts.yaml", ROOT / "deploy" / "grafana" / "nvmeof-csi.json")
RELEASE, NAMESPACE = "nvmeof-csi", "nvmeof-csi"
#: values.yaml image -> the versions.env pin of what the lab builds and the sidecar's upstream tag
PINS = {
    "provisioner": "CSI_PROVISIONER_VERSION",
    "attacher": "CSI_ATTACHER_VERSION",
    "resizer": "CSI_RESIZER_VERSION",
    "snapshotter": "EXTERNAL_SNAPSHOTTER_VERSION",
    "snapshotController": "EXTERNAL_SNAPSHOTTER_VERSION",
}
SCHEMA_REFUSAL = "values don't meet the specifications of the schema"


def value_sets() -> list[tuple[str, Path | None]]:
    """(name, values file) for the defaults (None) and every ``ci/*-values.yaml``."""
    return [("defaults", None), *((f"ci/{p.name}", p) for p in sorted((CHART / "ci").glob("*-values.yaml")))]


def _helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False, timeout=120)


def _values_args(values: Path | None) -> list[str]:
    return ["--values", str(values)] if values else []


def template(helm: str, values: Path | None) -> subprocess.CompletedProcess[str]:
    return _helm(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.37.0",
        *_values_args(values),
    )  # fmt: skip


def render(helm: str, values: Path | None) -> list[dict[str, Any]]:
    """Every object of the chart rendered with ``values`` (None: the defaults)."""
    out = template(helm, values)
    if out.returncode:
        raise SystemExit(f"validate: helm template with {values or 'the default values'}: {out.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def _config(docs: list[dict[str, Any]], name: str, key: str) -> Any:
    for doc in docs:
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == name:
            return yaml.safe_load(doc["data"][key])
    return None


def _parsed_configs(docs: list[dict[str, Any]]) -> list[str]:
    """Problems the driver's own parsers find in the rendered fabric map and agent policy. The parser opens an
    agent's TLS files, which exist only in the pod: here each must be one the chart mounts (under /tls), and
    the entry is parsed without them."""
    problems = []
    fabric = _config(docs, "nvmeof-csi-fabric-map", "fabric.yaml")
    authz = _config(docs, "nvmeof-csi-agent-authz", "authz.yaml")
    try:
        if fabric and fabric.get("agents"):  # the defaults name none (NOTES.txt warns)
            for agent in fabric["agents"]:
                tls = agent.pop("tls", None) or {}
                problems += [f"agent {agent.get('name')}: tls {k} {f!r} is not under /tls (the mounted Secret)"
                             for k, f in tls.items() if not str(f).startswith("/tls/")]  # fmt: skip
            parse_fabric_map(fabric)
        if authz is not None:
            parse_policy(authz)
    except ConfigError as err:
        problems.append(str(err))
    return problems


def _pins_problems(pins: Mapping[str, str]) -> list[str]:
    images = yaml.safe_load((CHART / "values.yaml").read_text())["images"]
    return [
        f"values.yaml images.{name}.tag is {images[name]['tag']}, versions.env {pin} is {pins[pin]}"
        for name, pin in PINS.items()
        if images[name]["tag"] != pins[pin]
    ]


def check_chart(helm: str, pins: Mapping[str, str]) -> list[str]:
    """Run every check above; print one line each; the problems."""
    problems: list[str] = []

    def record(what: str, found: list[str]) -> None:
        print(f"chart: {what}: {'ok' if not found else 'FAILED'}")
        for problem in found:
            print(f"  {problem}")
        problems.extend(found)

    jobs = selected_jobs(*(path.read_text() for path in MONITORING))
    for name, values in value_sets():
        lint = _helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *_values_args(values))
        record(f"helm lint --strict [{name}]", [lint.stdout + lint.stderr] if lint.returncode else [])
        docs = render(helm, values)
        record(f"fabric map and agent policy parsed by the driver [{name}]", _parsed_configs(docs))
        on_node_ip = bool(values and (yaml.safe_load(values.read_text()).get("metrics") or {}).get("onNodeIP"))
        record(f"hostNetwork listeners on loopback [{name}]", host_network_problems(docs, on_node_ip))
        record(f"NetworkPolicies of pod-network pods [{name}]", network_policy_problems(docs))
        record(f"tlshd holds only {', '.join(TLSHD_CAPABILITIES)} [{name}]", tlshd_problems(docs))
        record(
            f"alerts and dashboard select the jobs the ServiceMonitor makes [{name}]", monitoring_problems(docs, jobs)
        )
    with tempfile.TemporaryDirectory() as tmp:
        hostile = Path(tmp) / "hostile-values.yaml"
        hostile.write_text(yaml.safe_dump({key: {"extraArgs": list(HOSTILE_ARGS)} for key in EXTRA_ARGS_VALUES}))
        record("extra arguments stay arguments, never shell", shell_problems(render(helm, hostile)))
    bad = sorted(BAD_VALUES.glob("*.yaml"))
    if not bad:
        record("known-bad value sets", [f"no file in {BAD_VALUES}"])
    for path in bad:
        out = template(helm, path)
        refused = out.returncode != 0 and SCHEMA_REFUSAL in out.stderr
        why = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "(no error)"
        record(
            f"bad-values/{path.name} refused by the values schema ({why[:160]})",
            [] if refused else [f"bad-values/{path.name} was not refused by the schema: {why}"],
        )
    record("sidecar tags agree with versions.env", _pins_problems(pins))
    return problems
