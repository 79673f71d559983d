"""Kubernetes objects and waits for the Kubernetes tier: manifests as dicts (applied with kubectl), polling
with a deadline, and commands inside a running container through crictl in the node (the API server cannot
reach the kubelet: each VM forwards only the API server's port)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from lab.kube.build import binary
from lab.kube.cluster import KubeCluster
from lab.kube.node import CONTAINERD_SOCK

T = TypeVar("T")
NS = "default"
WORKLOAD = "localhost/workload:lab"
GPU_NODE = {"csi.nvmeof.io/gpu-node": "true"}


def wait_for(what: str, check: Callable[[], T | None], timeout: float, interval: float = 2.0) -> T:
    """Poll ``check`` until it returns something truthy; ``AssertionError`` naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f}s (last: {last!r})")


def pvc(
    name: str, sc: str, size: str = "1Gi", block: bool = False, source: Mapping[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "storageClassName": sc,
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
        "volumeMode": "Block" if block else "Filesystem",
    }
    if source:
        spec["dataSource"] = dict(source)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def pod_spec(claim: str, script: str, block: bool = False, restart: str = "Never") -> dict[str, Any]:
    """A workload container running ``script`` (busybox sh) with ``claim`` at /data (or /dev/xvda)."""
    container: dict[str, Any] = {
        "name": "work",
        "image": WORKLOAD,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", script],
        "terminationMessagePolicy": "File",
    }
    if block:
        container["volumeDevices"] = [{"name": "vol", "devicePath": "/dev/xvda"}]
    else:
        container["volumeMounts"] = [{"name": "vol", "mountPath": "/data"}]
    return {
        "restartPolicy": restart,
        "nodeSelector": GPU_NODE,
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
        "volumes": [{"name": "vol", "persistentVolumeClaim": {"claimName": claim}}],
    }


def pod(name: str, claim: str, script: str, block: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": pod_spec(claim, script, block),
    }


def job(name: str, claim: str, script: str) -> dict[str, Any]:
    """A training-style Job: one pod, no retries (a failure is the test's, not hidden by a retry)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(claim, script)},
        },
    }


def phase(kube: KubeCluster, kind: str, name: str) -> str:
    out = kube.kubectl("-n", NS, "get", kind, name, "-o", "jsonpath={.status.phase}", check=False)
    return out.strip()


def job_pod(kube: KubeCluster, job_name: str) -> dict[str, Any]:
    items = kube.cp.get("pods", "-n", NS, "-l", f"job-name={job_name}")["items"]
    assert len(items) == 1, f"job {job_name}: {len(items)} pods"
    return dict(items[0])


def termination_message(pod_obj: Mapping[str, Any]) -> str:
    for status in pod_obj["status"].get("containerStatuses", []):
        terminated = status.get("state", {}).get("terminated")
        if terminated:
            return str(terminated.get("message", "")).strip()
    return ""


def wait_job(kube: KubeCluster, name: str, timeout: float = 900) -> dict[str, Any]:
    """Wait for the Job to succeed; its pod (``AssertionError`` with the pod's state if it failed)."""

    def done() -> dict[str, Any] | None:
        status = kube.cp.get("job", "-n", NS, name).get("status", {})
        if status.get("failed"):
            raise AssertionError(f"job {name} failed: {job_pod(kube, name)['status']}")
        return job_pod(kube, name) if status.get("succeeded") else None

    return wait_for(f"job {name} succeeded", done, timeout)


def crictl_argv(*args: str) -> list[str]:
    """crictl's command line against the node's containerd."""
    return [str(binary("crictl")), "--runtime-endpoint", f"unix://{CONTAINERD_SOCK}", *args]


def crictl(kube: KubeCluster, node: str, *args: str, timeout: float = 120) -> str:
    """crictl in ``node``'s VM; its stdout."""
    return kube.vm(node).check(crictl_argv(*args), timeout=timeout)


def exited_log(kube: KubeCluster, node: str, pod_uid: str, name: str, lines: int) -> str:
    """The last ``lines`` lines the newest exited container ``name`` of pod ``pod_uid`` on ``node`` wrote, both
    streams; what went wrong instead when there is none (a diagnostic: it never raises)."""
    vm = kube.vm(node)
    found = vm.run(crictl_argv("ps", "-a", "-q", "--state", "exited", "--name", name, "--label",
                               f"io.kubernetes.pod.uid={pod_uid}"), 60)  # fmt: skip
    if found.rc or not found.out.split():
        return f"(no exited container {name}: {found.err.strip()[-200:]})"
    res = vm.run(crictl_argv("logs", "--tail", str(lines), found.out.split()[0]), 60)
    return (res.out + res.err).strip()


def pod_crictl(kube: KubeCluster, pod_name: str, *args: str, timeout: float = 120) -> str:
    """crictl in the VM of the node ``pod_name`` (namespace ``NS``) runs on."""
    return crictl(kube, kube.node_of(pod_name, NS), *args, timeout=timeout)


def container_id(kube: KubeCluster, pod_name: str) -> str:
    """The id of the running container of ``pod_name`` (one container)."""
    return pod_crictl(kube, pod_name, "ps", "-q", "--label", f"io.kubernetes.pod.name={pod_name}").strip()


def container_exec(kube: KubeCluster, pod_name: str, argv: Sequence[str], timeout: float = 120) -> str:
    """``argv`` inside the running container of ``pod_name`` (crictl exec in its node); its stdout."""
    node = kube.node_of(pod_name, NS)
    ids = crictl(
        kube,
        node,
        "ps",
        "-q",
        "--state",
        "Running",
        "--label",
        f"io.kubernetes.pod.name={pod_name}",
        "--label",
        f"io.kubernetes.pod.namespace={NS}",
    ).split()
    assert len(ids) == 1, f"{pod_name}: running containers {ids}"
    return crictl(kube, node, "exec", ids[0], *argv, timeout=timeout)


def file_in(kube: KubeCluster, pod_name: str, path: str) -> str:
    """The text of ``path`` in the running container of ``pod_name``; "" while the file is not there yet (a
    ``wait_for`` on it waits for the pod's script instead of failing at the first look)."""
    return container_exec(kube, pod_name, ["sh", "-c", 'cat "$0" 2>/dev/null || true', path])


def gone(kube: KubeCluster, *args: str) -> bool:
    """True when ``kubectl get ARGS`` lists nothing."""
    return not kube.cp.get(*args).get("items")


def events_of(kube: KubeCluster, kind: str, name: str, namespace: str = NS) -> str:
    """The events of one object, oldest first, as ``HH:MM:SS reason xN: message`` (messages cut to 160
    characters): where a move or a mount spent its time, for the report."""
    items = kube.cp.get(
        "events", "-n", namespace, "--field-selector", f"involvedObject.kind={kind},involvedObject.name={name}"
    )["items"]
    rows = []
    for e in items:
        at = str(e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"])
        rows.append(f"{at[11:19]} {e.get('reason', '')} x{e.get('count') or 1}: {str(e.get('message', ''))[:160]}")
    return " | ".join(sorted(rows))
