"""What the rendered chart must never do, checked on the objects ``helm template`` renders (any value set):

- a hostNetwork pod (node plugin, agent) listens for /metrics and /healthz on loopback only (on the host network
  any other address is open to every network the node is on), unless the value set opens /metrics on the
  node's IP (``metrics.onNodeIP``), and then only /metrics; its HTTP probes knock on loopback;
- the pods on the pod network (controller, snapshot-controller) have an ingress NetworkPolicy that opens
  nothing but the controller's ``metrics`` port, whenever the policies are rendered.

Contract: each function takes rendered objects and returns problems, one line each (empty: none). Pure: no
I/O, so the unit tier checks the checks themselves with objects made to break them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

LISTEN = re.compile(r"--(metrics-listen|health-listen|http-endpoint)[= ]\"?([^\s\"]+)")
WORKLOADS = ("DaemonSet", "Deployment")
LOOPBACK = "127.0.0.1"
NODE_IP_ENV = "status.hostIP"  # the downward-API field an env var takes the node's IP from


def _host_network_containers(docs: Sequence[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc.get("kind") in WORKLOADS and doc["spec"]["template"]["spec"].get("hostNetwork"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield f"{doc['metadata']['name']}/{container['name']}", container


def _env(container: dict[str, Any]) -> dict[str, str]:
    """name -> literal value, or ``<node IP>`` for a variable taken from the node's IP."""
    env = {}
    for item in container.get("env", []):
        field = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[item["name"]] = "<node IP>" if field == NODE_IP_ENV else str(item.get("value", ""))
    return env


def listeners(container: dict[str, Any]) -> list[tuple[str, str]]:
    """(flag, host) of every listen address in the container's command and args, variables resolved."""
    words = " ".join([*container.get("command", []), *container.get("args", [])])
    found = []
    for flag, written in LISTEN.findall(words):
        address = written
        for name, value in _env(container).items():
            address = address.replace(f"$({name})", value).replace(f"${{{name}}}", value)
        found.append((flag, address.rsplit(":", 1)[0]))
    return found


def host_network_problems(docs: Sequence[dict[str, Any]], metrics_on_node_ip: bool) -> list[str]:
    problems, seen = [], 0
    for where, container in _host_network_containers(docs):
        for flag, host in listeners(container):
            seen += 1
            allowed = {LOOPBACK, "<node IP>"} if (flag == "metrics-listen" and metrics_on_node_ip) else {LOOPBACK}
            if host not in allowed:
                problems.append(f"{where}: --{flag} on {host!r} (hostNetwork: only {sorted(allowed)})")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            http = container.get(probe, {}).get("httpGet")
            if http is not None and http.get("host") != LOOPBACK:
                problems.append(f"{where}: {probe} knocks on the pod IP, not {LOOPBACK}")
    daemonsets = [d for d in docs if d.get("kind") == "DaemonSet"]
    if daemonsets and seen < 2:
        problems.append(f"only {seen} listeners found on hostNetwork pods: the check no longer sees them")
    return problems


def network_policy_problems(docs: Sequence[dict[str, Any]]) -> list[str]:
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    if not policies:
        return []  # networkPolicy.enabled: false, the operator's choice
    problems = []
    apps = [
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        for d in docs
        if d.get("kind") == "Deployment"
    ]
    for app in apps:
        chosen = [p for p in policies if p["spec"]["podSelector"].get("matchLabels") == {"app.kubernetes.io/name": app}]
        if not chosen or "Ingress" not in chosen[0]["spec"].get("policyTypes", []):
            problems.append(f"{app}: no ingress NetworkPolicy")
            continue
        for rule in chosen[0]["spec"].get("ingress", []):
            ports = [port.get("port") for port in rule.get("ports", [])]
            if ports != ["metrics"]:
                problems.append(f"{app}: its NetworkPolicy opens {ports or 'every port'}, not only metrics")
    return problems
