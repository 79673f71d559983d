"""Benchmark: many PVCs created at once through the real external-provisioner, on the lab Kubernetes cluster
(``lab/kube/cluster.py``: Kubernetes 1.37, the driver installed with Helm). Writes results/bench-k8s-pvcs.json.

Three passes on one cluster: the chart's sidecar flags (the provisioner's defaults: client rate limit
``--kube-api-qps=5``/``--kube-api-burst=10``, 100 worker threads), then raised limits set through ``helm upgrade``
(``controller.sidecarExtraArgs.provisioner``: ``--kube-api-qps=50 --kube-api-burst=100``), then those and our
controller's ``--workers=32`` (``controller.extraArgs``: the threads its calls to the agents run on). In each
pass ``count`` claims of an Immediate-binding StorageClass are applied in one List and polled until every one is
Bound (time to all Bound, CreateVolume rate), then deleted at once until every PersistentVolume is gone. Which
part sets the limit is read in the same pass: the seconds our controller spent in CreateVolume (its
``csi_plugin_operations_seconds``, read on the node), against the wall time, and the provisioner's client-side
throttling (its log's "due to client-side throttling" waits, counted and summed), and where the CPU went while
the claims were created (``bench/k8s_cpu.py``: each process's share of a CPU, each VM's busy share).

usage: python -m bench.k8s_pvcs [--count 100] [--smoke]
``--smoke``: 4 claims, one pass (``python -m bench.suite --smoke --only k8s-pvcs``); ``./dev bench`` runs the full
size on a cluster booted for it.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from typing import Any

from bench.k8s_cpu import reading as cpu_reading
from bench.k8s_cpu import spent
from bench.k8s_dumps import dumps, where
from bench.results import save
from lab.kube.cluster import CHART, LAB_VALUES, NAMESPACE, RELEASE, KubeCluster, running_cluster

SC = "bench-now"
PREFIX = "bench-pvc-"
NS = "default"
VERBOSE = ["--v=3"]  # client-go logs each wait on its rate limiter past 50 ms at level 3
RAISED = ["--kube-api-qps=50", "--kube-api-burst=100"]
WORKERS = ["--workers=32"]  # our controller's pool for blocking work (asyncio's default: 6 on a 2-CPU node)
THROTTLED = re.compile(r'Waited before sending request" delay="([0-9.]+)(ms|s)" reason="client-side throttling')
CREATE = 'method_name="/csi.v1.Controller/CreateVolume"'
AGENT_OP = re.compile(
    r'csi_plugin_operations_seconds_(?P<what>sum|count)\{.*method_name="/[^"]*/(?P<method>\w+)".*\} (?P<value>\S+)$'
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100, help="claims created at once")
    ap.add_argument("--smoke", action="store_true", help="4 claims, the default flags only; not a measurement")
    return ap


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": SC},
        "provisioner": "csi.nvmeof.io",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Delete",
        "parameters": {"transport": "tcp"},
    }


def claims(count: int) -> dict[str, Any]:
    items = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"{PREFIX}{i}", "namespace": NS},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": SC,
                "resources": {"requests": {"storage": "64Mi"}},
            },
        }
        for i in range(count)
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _bound(kube: KubeCluster) -> int:
    items = kube.cp.get("pvc", "-n", NS)["items"]
    return sum(1 for c in items if c["metadata"]["name"].startswith(PREFIX) and c["status"].get("phase") == "Bound")


def _volumes(kube: KubeCluster) -> int:
    return sum(1 for pv in kube.cp.get("pv")["items"] if pv["spec"].get("storageClassName") == SC)


def _until(what: str, check: Any, timeout: float) -> float:
    """Seconds until ``check()`` is true (polled every 0.5 s); ``TimeoutError`` naming ``what``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():
            return time.monotonic() - began
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def _controller_pod(kube: KubeCluster) -> dict[str, Any]:
    """The Ready controller pod (one of a rollout that is still terminating is not asked)."""
    pods = kube.cp.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=nvmeof-csi-controller")["items"]
    ready = [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]
    return dict(ready[0])


def _controller_create_seconds(kube: KubeCluster) -> tuple[float, int]:
    """(seconds, calls) of CreateVolume in our controller so far, from its /metrics read on the node."""
    pod = _controller_pod(kube)
    url = f"http://{pod['status']['podIP']}:9810/metrics"
    vm = kube.vm(pod["spec"]["nodeName"])
    text = vm.check([vm.python, "-c", f"import urllib.request as u; print(u.urlopen({url!r}).read().decode())"])
    total = count = 0.0
    for line in text.splitlines():
        if CREATE in line and line.startswith("csi_plugin_operations_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif CREATE in line and line.startswith("csi_plugin_operations_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, int(count)


def _agent_seconds(kube: KubeCluster) -> dict[str, list[float]]:
    """{agent method: [seconds, calls]} so far, summed over every agent (their /metrics on the node's loopback):
    the agents' side of the controller's CreateVolume seconds (which calls wait in the agent, which before)."""
    pods = kube.cp.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=nvmeof-csi-agent")["items"]
    out: dict[str, list[float]] = {}
    for node in sorted({p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}):
        vm = kube.vm(node)
        text = vm.check([vm.python, "-c", "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9811/metrics')"
                         ".read().decode())"])  # fmt: skip
        for line in text.splitlines():
            found = AGENT_OP.match(line)
            if found:
                slot = out.setdefault(found["method"], [0.0, 0.0])
                slot[0 if found["what"] == "sum" else 1] += float(found["value"])
    return out


def _controller_dumps(kube: KubeCluster) -> list[str]:
    """py-spy dumps of our controller while the claims are being created (the first 10 s after they are applied
    left to fill the queue)."""
    time.sleep(10)
    return dumps(kube.vm(_controller_pod(kube)["spec"]["nodeName"]), "--mode=controller")


def _threads(taken: list[str]) -> dict[str, Any]:
    """Where the controller's threads were, summed over the dumps (``bench/k8s_dumps.py``), the 12 most common."""
    counts: dict[str, int] = {}
    for dump in taken:
        for key, n in where(dump).items():
            counts[key] = counts.get(key, 0) + n
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:12]
    return {"dumps": sum(1 for d in taken if d), "threads": dict(top)}


def _throttled(kube: KubeCluster) -> tuple[int, float]:
    """(waits, seconds) of client-side throttling in the Ready controller pod's provisioner log so far."""
    pod = _controller_pod(kube)
    meta = pod["metadata"]
    folder = f"/var/log/pods/{NAMESPACE}_{meta['name']}_{meta['uid']}/csi-provisioner"
    log = kube.vm(pod["spec"]["nodeName"]).sh(f"cat {folder}/*.log 2>/dev/null", 60).out
    waits = THROTTLED.findall(log)
    return len(waits), sum(float(v) / (1000 if unit == "ms" else 1) for v, unit in waits)


def one_pass(kube: KubeCluster, count: int, label: str) -> dict[str, Any]:
    """``count`` claims at once until all Bound, then all deleted until no volume is left."""
    seconds0, calls0 = _controller_create_seconds(kube)
    waits0, waited0 = _throttled(kube)
    agent0 = _agent_seconds(kube)
    cpu0, began = cpu_reading(kube), time.monotonic()
    kube.cp.apply(claims(count))
    taken: list[str] = []
    spying = threading.Thread(target=lambda: taken.extend(_controller_dumps(kube)), daemon=True)
    spying.start()
    bound_s = _until(f"{count} claims Bound", lambda: _bound(kube) == count, 300 + 10 * count)
    spying.join(timeout=600)
    cpu = spent(cpu0, cpu_reading(kube), time.monotonic() - began)
    agent1 = _agent_seconds(kube)
    in_agents = {
        m: {"seconds": round(v[0] - agent0.get(m, [0.0, 0.0])[0], 1), "calls": int(v[1] - agent0.get(m, [0.0, 0.0])[1])}
        for m, v in agent1.items()
        if v[1] > agent0.get(m, [0.0, 0.0])[1]
    }
    seconds1, calls1 = _controller_create_seconds(kube)
    waits1, waited1 = _throttled(kube)
    began = time.monotonic()
    kube.kubectl("-n", NS, "delete", "pvc", *(f"{PREFIX}{i}" for i in range(count)), "--wait=false", timeout=300)
    gone_s = _until("every volume deleted", lambda: _volumes(kube) == 0, 300 + 10 * count)
    row = {
        "pass": label,
        "count": count,
        "all_bound_s": round(bound_s, 1),
        "creates_per_s": round(count / bound_s, 2),
        "all_deleted_s": round(gone_s, 1),
        "deletes_per_s": round(count / gone_s, 2),
        "controller_create_calls": calls1 - calls0,
        "controller_create_s": round(seconds1 - seconds0, 1),
        "controller_share": round((seconds1 - seconds0) / bound_s, 2),  # >1: calls overlapped
        "throttled_waits": waits1 - waits0,
        "throttled_s": round(waited1 - waited0, 1),
        "delete_wall_s": round(time.monotonic() - began, 1),
        "cpu_while_creating": cpu,  # each part's share of one CPU, each VM's busy share (bench/k8s_cpu.py)
        "agent_calls_while_creating": in_agents,  # {method: seconds, calls} in the agents themselves
        "controller_threads_while_creating": _threads(taken),  # py-spy dumps: where its threads were
    }
    print(f"bench k8s-pvcs: {row}", flush=True)
    return row


def provisioner_flags(kube: KubeCluster, flags: list[str], controller: list[str] | None = None) -> None:
    """``helm upgrade`` of the lab release with these extra provisioner flags (and our controller's extra flags,
    none by default); waits for the rollout."""
    kube.helm(
        "upgrade", RELEASE, str(CHART), "--values", str(LAB_VALUES),
        "--set-json", f"controller.sidecarExtraArgs.provisioner={json.dumps(flags)}",
        "--set-json", f"controller.extraArgs={json.dumps(controller or [])}",
    )  # fmt: skip
    kube.wait_driver_ready()


def run_on(kube: KubeCluster, args: argparse.Namespace) -> dict[str, Any]:
    """The passes on a running cluster; saves and returns the result. The smoke runs one pass on the release as
    it is (no restart; its throttling count is 0: the provisioner logs its waits only at ``--v=3``)."""
    count = 4 if args.smoke else args.count
    kube.cp.apply(storage_class())
    if args.smoke:
        rows = [one_pass(kube, count, "chart defaults")]
    else:
        provisioner_flags(kube, VERBOSE)
        rows = [one_pass(kube, count, "chart defaults (provisioner --v=3)")]
        provisioner_flags(kube, VERBOSE + RAISED)
        rows.append(one_pass(kube, count, f"provisioner {' '.join(RAISED)}"))
        provisioner_flags(kube, VERBOSE + RAISED, WORKERS)
        rows.append(one_pass(kube, count, f"provisioner {' '.join(RAISED)}, controller {' '.join(WORKERS)}"))
        provisioner_flags(kube, [])
    kube.kubectl("delete", "storageclass", SC, "--ignore-not-found")
    result = {"smoke": args.smoke, "count": count, "passes": rows}
    if len(rows) == 3:
        result["raised_over_defaults"] = round(rows[0]["all_bound_s"] / rows[1]["all_bound_s"], 2)
        result["workers_over_raised"] = round(rows[1]["all_bound_s"] / rows[2]["all_bound_s"], 2)
    save("k8s-pvcs", result)
    return result


def run(args: argparse.Namespace) -> None:
    """The benchmark on a lab Kubernetes cluster booted for it."""
    with running_cluster() as kube:
        run_on(kube, args)


def main() -> None:
    run(parser().parse_args())


if __name__ == "__main__":
    main()
