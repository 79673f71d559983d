"""The shipped manifests open nothing they need not: a hostNetwork pod (node plugin, agent) listens for /metrics
and /healthz on loopback only (on the host network any other address is open to every network the node is on),
its probes knock there, and the pods on the pod network have a NetworkPolicy. Read from the YAML under
``deploy/`` (the lint tier renders and validates the overlays with kustomize)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
LISTEN = re.compile(r"--(?:metrics-listen|health-listen|http-endpoint)[= ]\"?([^\s\"]+)")
WORKLOADS = ("DaemonSet", "Deployment")


def documents(*files: Path) -> Iterator[dict[str, Any]]:
    for path in files:
        yield from (doc for doc in yaml.safe_load_all(path.read_text()) if doc)


def host_network_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """(where, container, its env as name -> literal value) of every container of a hostNetwork workload in the
    base and in the lab overlay's patches (merged by container name, as kustomize would)."""
    base = [d for d in documents(*sorted((DEPLOY / "base").glob("*.yaml"))) if d.get("kind") in WORKLOADS]
    patches = list(documents(*sorted((DEPLOY / "overlays").glob("*/*.yaml"))))
    for doc in base:
        spec = doc["spec"]["template"]["spec"]
        if not spec.get("hostNetwork"):
            continue
        for container in spec["containers"]:
            env = {e["name"]: str(e.get("value", "")) for e in container.get("env", [])}
            yield f"base {doc['metadata']['name']}/{container['name']}", container, env
            for patch in patches:
                if patch.get("kind") != doc["kind"] or patch.get("metadata", {}).get("name") != doc["metadata"]["name"]:
                    continue
                for patched in patch["spec"]["template"]["spec"].get("containers", []):
                    if patched["name"] == container["name"] and "$patch" not in patched:
                        patched_env = env | {e["name"]: str(e.get("value", "")) for e in patched.get("env", [])}
                        yield (
                            f"patch {doc['metadata']['name']}/{container['name']}",
                            {**container, **patched},
                            patched_env,
                        )


def listen_hosts(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    words = " ".join([*container.get("command", []), *container.get("args", [])])
    hosts = []
    for address in LISTEN.findall(words):
        for name, value in env.items():
            address = address.replace(f"$({name})", value).replace(f"${{{name}}}", value)
        hosts.append(address.rsplit(":", 1)[0])
    return hosts


def test_host_network_pods_listen_on_loopback_only() -> None:
    seen = 0
    for where, container, env in host_network_containers():
        for host in listen_hosts(container, env):
            seen += 1
            assert host == "127.0.0.1", f"{where} listens on {host!r}"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            http = container.get(probe, {}).get("httpGet")
            if http is not None:
                assert http.get("host") == "127.0.0.1", f"{where} {probe} knocks on the pod IP"
    assert seen >= 4, "the node plugin's and the agent's listeners were not found"


@pytest.mark.parametrize("app", ["nvmeof-csi-controller", "snapshot-controller"])
def test_pods_on_the_pod_network_have_a_network_policy(app: str) -> None:
    policies = [d for d in documents(DEPLOY / "base" / "network-policy.yaml") if d["kind"] == "NetworkPolicy"]
    selected = [p for p in policies if p["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": app}]
    assert selected and "Ingress" in selected[0]["spec"]["policyTypes"]
    for rule in selected[0]["spec"].get("ingress", []):
        assert [port["port"] for port in rule["ports"]] == ["metrics"], rule


def test_the_metrics_component_opens_metrics_only() -> None:
    component = DEPLOY / "components" / "metrics-on-node-ip"
    for doc in documents(*sorted(component.glob("*.yaml"))):
        if doc.get("kind") not in WORKLOADS:
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            names = [e["name"] for e in container["env"]]
            assert names == ["NVMEOF_CSI_METRICS_HOST"], names
