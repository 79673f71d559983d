"""The chart's listener and NetworkPolicy checks (``deploy/chart_policy.py``, run by the lint tier on every
rendered value set) catch what they are for: objects made to break each rule are refused, the good ones pass."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy"))
from chart_policy import (
    TLSHD_CAPABILITIES,
    host_network_problems,
    listeners,
    monitoring_problems,
    network_policy_problems,
    scraped_jobs,
    selected_jobs,
    shell_problems,
    tlshd_problems,
)

from image.tlshd import CAPABILITIES


def daemonset(args: list[str], env: list[dict[str, Any]], probe_host: str | None = "127.0.0.1") -> dict[str, Any]:
    http: dict[str, Any] = {"path": "/healthz", "port": "healthz"}
    if probe_host:
        http["host"] = probe_host
    container = {"name": "nvmeof-csi", "args": args, "env": env, "livenessProbe": {"httpGet": http}}
    return {
        "kind": "DaemonSet",
        "metadata": {"name": "nvmeof-csi-node"},
        "spec": {"template": {"spec": {"hostNetwork": True, "containers": [container]}}},
    }


LOOPBACK_ENV = [{"name": "NVMEOF_CSI_METRICS_HOST", "value": "127.0.0.1"}]
NODE_IP_ENV = [{"name": "NVMEOF_CSI_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
ARGS = ["--metrics-listen=$(NVMEOF_CSI_METRICS_HOST):9810", "--health-listen=127.0.0.1:9809"]


def test_loopback_listeners_pass_and_resolve_variables() -> None:
    ds = daemonset(ARGS, LOOPBACK_ENV)
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert listeners(container) == [("metrics-listen", "127.0.0.1"), ("health-listen", "127.0.0.1")]
    assert host_network_problems([ds], metrics_on_node_ip=False) == []


def test_a_listener_on_every_address_is_refused() -> None:
    problems = host_network_problems([daemonset(["--health-listen=0.0.0.0:9809", *ARGS[:1]], LOOPBACK_ENV)], False)
    assert problems and "0.0.0.0" in problems[0]


def test_metrics_on_the_node_ip_only_when_the_values_open_them() -> None:
    ds = daemonset(ARGS, NODE_IP_ENV)
    assert host_network_problems([ds], metrics_on_node_ip=True) == []
    assert host_network_problems([ds], metrics_on_node_ip=False)
    health_on_node_ip = daemonset(
        ["--health-listen=$(NVMEOF_CSI_METRICS_HOST):9809", "--metrics-listen=127.0.0.1:1"], NODE_IP_ENV
    )
    assert host_network_problems([health_on_node_ip], metrics_on_node_ip=True)


def test_a_probe_on_the_pod_ip_is_refused() -> None:
    assert host_network_problems([daemonset(ARGS, LOOPBACK_ENV, probe_host=None)], False)


def test_listeners_the_check_cannot_see_are_a_problem() -> None:
    assert host_network_problems([daemonset([], LOOPBACK_ENV)], False)


def deployment(app: str) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": app},
        "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/name": app}}, "spec": {"containers": []}}},
    }


def policy(app: str, ingress: list[dict[str, Any]] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": app}}, "policyTypes": ["Ingress"]}
    if ingress is not None:
        spec["ingress"] = ingress
    return {"kind": "NetworkPolicy", "metadata": {"name": app}, "spec": spec}


def test_network_policies() -> None:
    good = [
        deployment("nvmeof-csi-controller"),
        deployment("snapshot-controller"),
        policy("nvmeof-csi-controller", [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]),
        policy("snapshot-controller", None),
    ]
    assert network_policy_problems(good) == []
    missing = [d for d in good if d["metadata"]["name"] != "snapshot-controller" or d["kind"] != "NetworkPolicy"]
    assert network_policy_problems(missing) == ["snapshot-controller: no ingress NetworkPolicy"]
    wide = copy.deepcopy(good)
    wide[2]["spec"]["ingress"] = [{"ports": [{"port": "metrics"}, {"port": 9808}]}]
    assert network_policy_problems(wide)
    everything = copy.deepcopy(good)
    everything[2]["spec"]["ingress"] = [{}]
    assert network_policy_problems(everything)


def workload(name: str, command: list[str], args: list[str]) -> dict[str, Any]:
    container = {"name": name, "command": command, "args": args}
    return {
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"containers": [container]}}},
    }


def test_extra_arguments_pasted_into_a_shell_script_are_refused() -> None:
    hostile = ["--x=$(touch /tmp/p)"]
    pasted = workload("agent", ["/bin/sh", "-c"], ["exec agent --a 1 '--x=$(touch /tmp/p)'"])
    whole = [workload(n, [], ["--a", *hostile]) for n in ("controller", "node")]
    problems = shell_problems([pasted, *whole], hostile)
    assert any("pasted into its shell script" in p for p in problems)
    assert any("only 2 containers" in p for p in problems)


def test_extra_arguments_as_positional_parameters_pass() -> None:
    hostile = ["--x=$(touch /tmp/p)", "--y=`id`"]
    agent = workload("agent", ["/bin/sh", "-c"], ['exec agent --a 1 "$@"', "agent", *hostile])
    whole = [workload(n, [], ["--a", *hostile]) for n in ("controller", "node")]
    assert shell_problems([agent, *whole], hostile) == []


def test_tlshd_holds_only_the_capabilities_the_lab_runs_it_with() -> None:
    assert TLSHD_CAPABILITIES == CAPABILITIES  # the lab's TLS volumes run tlshd with exactly these
    good = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}  # fmt: skip
    for context, problems in (
        (good, 0),
        ({"privileged": True}, 3),  # the chart before: privileged
        ({**good, "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}}, 1),
        ({**good, "readOnlyRootFilesystem": False}, 1),
    ):
        pod = {"containers": [{"name": "tlshd", "securityContext": context}]}
        doc = {"kind": "DaemonSet", "metadata": {"name": "n"}, "spec": {"template": {"spec": pod}}}
        assert len(tlshd_problems([doc])) == problems, context


def test_the_jobs_the_alerts_select_are_the_jobs_the_service_monitor_makes() -> None:
    """The Prometheus Operator names a job after the Service unless ``jobLabel`` says which label to take: the
    chart's ServiceMonitor lacked it, so ``up{job="nvmeof-csi-agent"}`` matched nothing it scraped."""
    service = {"kind": "Service", "metadata": {"name": "nvmeof-csi-agent-metrics",
               "labels": {"app.kubernetes.io/name": "nvmeof-csi-agent", "nvmeof-csi/metrics": "true"}}}  # fmt: skip
    monitor: dict[str, Any] = {
        "kind": "ServiceMonitor",
        "spec": {"selector": {"matchLabels": {"nvmeof-csi/metrics": "true"}}},
    }
    selected = selected_jobs('expr: up{job="nvmeof-csi-agent"} == 0', '"expr": "up{job=\\\\"nvmeof-csi-agent\\\\"}"')
    assert selected == {"nvmeof-csi-agent"}
    assert scraped_jobs([service, monitor]) == {"nvmeof-csi-agent-metrics"}
    assert monitoring_problems([service, monitor], selected)  # the chart before: no jobLabel
    with_label = copy.deepcopy(monitor)
    with_label["spec"]["jobLabel"] = "app.kubernetes.io/name"
    assert scraped_jobs([service, with_label]) == {"nvmeof-csi-agent"}
    assert monitoring_problems([service, with_label], selected) == []
    assert monitoring_problems([service], selected) == []  # no ServiceMonitor: nothing scraped through the chart
