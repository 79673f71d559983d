"""Benchmark: claims and their pods spread over both GPU nodes of the lab Kubernetes cluster
(``lab/kube/cluster.py``: ``storage-1``, ``gpu-1``, ``gpu-2``). Writes results/bench-k8s-spread.json.

``count`` WaitForFirstConsumer claims of the lab's TCP class and one pod per claim (each writes and syncs a file,
then sleeps), spread one by one over the GPU nodes by a topology spread constraint on the hostname, applied in one
List. Per claim, from the API server's own timestamps (1 s resolution): claim -> Bound (its PersistentVolume's
creation time against the claim's), pod -> Running (the Ready condition's transition against the pod's creation);
median and p95 of each, and the pods per node. Then everything is deleted and the time until no volume is left.

usage: python -m bench.k8s_spread [--count 20] [--smoke]
``--smoke``: 2 claims, one pod on each GPU node (``python -m bench.suite --smoke --only k8s-spread``); ``./dev
bench`` runs the full size on a cluster booted for it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Any

from bench.results import save
from lab.kube.cluster import KubeCluster, running_cluster
from lab.kube.control_plane import api_time

NS = "default"
SC = "lab-tcp"
PREFIX = "spread-"
IMAGE = "localhost/workload:lab"
SCRIPT = "dd if=/dev/zero of=/data/f bs=1M count=1 conv=fsync 2>/dev/null; sleep 100000"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20, help="claims and pods created at once")
    ap.add_argument("--smoke", action="store_true", help="2 claims, one pod on each GPU node; not a measurement")
    return ap


def objects(count: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(count):
        name = f"{PREFIX}{i}"
        items.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": SC,
                    "resources": {"requests": {"storage": "64Mi"}},
                },
            }
        )
        spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
                  "labelSelector": {"matchLabels": {"app": "spread"}}}  # fmt: skip
        container = {"name": "work", "image": IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", SCRIPT],
                     "volumeMounts": [{"name": "vol", "mountPath": "/data"}]}  # fmt: skip
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": {"app": "spread"}},
                "spec": {
                    "nodeSelector": {"csi.nvmeof.io/gpu-node": "true"},
                    "topologySpreadConstraints": [spread],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [container],
                    "volumes": [{"name": "vol", "persistentVolumeClaim": {"claimName": name}}],
                },
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _ready_at(pod: dict[str, Any]) -> float | None:
    for cond in pod["status"].get("conditions", []):
        if cond["type"] == "Ready" and cond["status"] == "True":
            return api_time(cond["lastTransitionTime"])
    return None


def run_on(kube: KubeCluster, args: argparse.Namespace) -> dict[str, Any]:
    """One pass on a running cluster; saves and returns the result."""
    count = 2 if args.smoke else args.count
    began = time.monotonic()
    kube.cp.apply(objects(count))
    deadline = began + 300 + 30 * count  # bounds to give up at, not goals: a slow emulated host
    pods: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pods = [p for p in kube.cp.get("pods", "-n", NS, "-l", "app=spread")["items"]]
        if len(pods) == count and all(_ready_at(p) for p in pods):
            break
        time.sleep(2)
    else:
        raise TimeoutError(f"{count} spread pods not all Running: {[p['status'].get('phase') for p in pods]}")
    all_running = time.monotonic() - began
    claims = {c["metadata"]["name"]: c for c in kube.cp.get("pvc", "-n", NS)["items"]}
    volumes = {pv["metadata"]["name"]: pv for pv in kube.cp.get("pv")["items"]}
    bound, running = [], []
    for p in pods:
        claim = claims[p["metadata"]["name"]]
        pv = volumes[claim["spec"]["volumeName"]]
        bound.append(api_time(pv["metadata"]["creationTimestamp"]) - api_time(claim["metadata"]["creationTimestamp"]))
        running.append((_ready_at(p) or 0.0) - api_time(p["metadata"]["creationTimestamp"]))
    per_node = Counter(str(p["spec"]["nodeName"]) for p in pods)
    t0 = time.monotonic()
    names = [f"{PREFIX}{i}" for i in range(count)]
    kube.kubectl("-n", NS, "delete", *(f"pod/{n}" for n in names), "--wait=true", timeout=600)
    kube.kubectl("-n", NS, "delete", *(f"pvc/{n}" for n in names), "--wait=false", timeout=300)
    while any(pv["spec"].get("claimRef", {}).get("name", "").startswith(PREFIX) for pv in kube.cp.get("pv")["items"]):
        if time.monotonic() - t0 > 300 + 20 * count:
            raise TimeoutError("spread volumes not deleted")
        time.sleep(2)
    result = {
        "smoke": args.smoke,
        "count": count,
        "pods_per_node": dict(sorted(per_node.items())),
        "claim_bound_s": {"median": statistics.median(bound), "p95": _p95(bound)},
        "pod_running_s": {"median": statistics.median(running), "p95": _p95(running)},
        "all_running_s": round(all_running, 1),
        "all_deleted_s": round(time.monotonic() - t0, 1),
    }
    print(f"bench k8s-spread: {result}", flush=True)
    save("k8s-spread", result)
    return result


def run(args: argparse.Namespace) -> None:
    """The benchmark on a lab Kubernetes cluster booted for it."""
    with running_cluster() as kube:
        run_on(kube, args)


def main() -> None:
    run(parser().parse_args())


if __name__ == "__main__":
    main()
