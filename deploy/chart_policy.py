"""What the rendered chart must never do, checked on the objects ``helm template`` renders (any value set):

- a hostNetwork pod (node plugin, agent) listens for /metrics and /healthz on loopback only (on the host network
  any other address is open to every network the node is on), unless the value set opens /metrics on the
  node's IP (``metrics.onNodeIP``), and then only /metrics; its HTTP probes knock on loopback;
- the pods on the pod network (controller, snapshot-controller) have an ingress NetworkPolicy that opens
  nothing but the controller's ``metrics`` port, whenever the policies are rendered;
- a value never becomes shell: a container that runs ``sh -c`` has a script of fixed text, and a value set's
  extra arguments (:data:`HOSTILE_ARGS`) reach each of our workloads as whole arguments of their own.

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
#: extra arguments that would run commands if a template pasted them into a shell script
HOSTILE_ARGS = ("--x=$(touch /tmp/nvmeof-csi-pwned)", "--y=`id`;reboot", "--z=' && reboot '")
#: the values that carry extra arguments of our own containers
EXTRA_ARGS_VALUES = ("controller", "node", "agent")
#: all that tlshd is granted (the handshake netlink family's ACCEPT and DONE are admin commands); the lab runs it
#: with exactly these (``image/tlshd.py`` CAPABILITIES, ``lab/tlshd.py``)
TLSHD_CAPABILITIES = ("NET_ADMIN",)


def _containers(
    docs: Sequence[dict[str, Any]], host_network_only: bool = False
) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        pod = doc["spec"]["template"]["spec"] if doc.get("kind") in WORKLOADS else None
        if pod is not None and (pod.get("hostNetwork") or not host_network_only):
            for container in pod["containers"]:
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
    for where, container in _containers(docs, host_network_only=True):
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


def _shell_script(container: dict[str, Any]) -> str | None:
    """The script of a container that runs ``<shell> -c <script>``, or ``None``."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in {"sh", "bash", "ash", "dash"} and argv[1] == "-c":
        return str(argv[2])
    return None


def shell_problems(docs: Sequence[dict[str, Any]], hostile: Sequence[str] = HOSTILE_ARGS) -> list[str]:
    """Objects rendered with ``hostile`` as every workload's extra arguments: no shell script holds any of
    them, and each of the ``EXTRA_ARGS_VALUES`` workloads gets each one as an argument of its own."""
    problems, whole = [], 0
    for where, container in _containers(docs):
        script = _shell_script(container)
        leaked = [arg for arg in hostile if script is not None and arg.split("=", 1)[-1] in script]
        problems += [f"{where}: extra argument {arg!r} is pasted into its shell script" for arg in leaked]
        argv = [*container.get("command", []), *container.get("args", [])]
        whole += all(arg in argv for arg in hostile)
    if whole < len(EXTRA_ARGS_VALUES):
        problems.append(f"only {whole} containers got the extra arguments whole, not {len(EXTRA_ARGS_VALUES)}")
    return problems


def tlshd_problems(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Each tlshd container: never privileged, every capability dropped but :data:`TLSHD_CAPABILITIES`, no
    privilege escalation, a read-only root."""
    found = []
    for name, container in _containers(docs):
        if not name.endswith("/tlshd"):
            continue
        context = container.get("securityContext") or {}
        caps = context.get("capabilities") or {}
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if caps.get("drop") != ["ALL"] or tuple(caps.get("add") or ()) != TLSHD_CAPABILITIES:
            found.append(f"{name}: capabilities {caps}, not all dropped but {list(TLSHD_CAPABILITIES)}")
        if context.get("allowPrivilegeEscalation") is not False or context.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: privilege escalation allowed or a writable root")
    return found


JOB_SELECTOR = re.compile(r'job=\\?"([^"\\]+)\\?"')


def selected_jobs(*texts: str) -> set[str]:
    """The ``job="..."`` values alert rules and dashboard queries select (also JSON-escaped)."""
    return {job for text in texts for job in JOB_SELECTOR.findall(text)}


def scraped_jobs(docs: Sequence[dict[str, Any]]) -> set[str]:
    """The ``job`` label the Prometheus Operator gives each Service a rendered ServiceMonitor selects: the value of
    the Service's label that ``spec.jobLabel`` names, else the Service's name."""
    jobs = set()
    services = [d for d in docs if d.get("kind") == "Service"]
    for monitor in (d for d in docs if d.get("kind") == "ServiceMonitor"):
        wanted = monitor["spec"]["selector"].get("matchLabels", {})
        label = monitor["spec"].get("jobLabel", "")
        for service in services:
            labels = service["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in wanted.items()):
                jobs.add(labels[label] if label in labels else service["metadata"]["name"])
    return jobs


def monitoring_problems(docs: Sequence[dict[str, Any]], selected: set[str]) -> list[str]:
    """Every job the alerts and the dashboard select is one the rendered ServiceMonitor produces (value sets
    without a ServiceMonitor scrape nothing through the chart: nothing to check)."""
    jobs = scraped_jobs(docs)
    if not jobs:
        return []
    return [f"job {job!r} is selected by the alerts or the dashboard; the ServiceMonitor makes {sorted(jobs)}"
            for job in sorted(selected - jobs)]  # fmt: skip
