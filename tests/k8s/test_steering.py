"""The real scheduler keeps pods on the storage fabric that reaches their volume (Kubernetes across machines,
point 2): ``gpu-1`` has soft-RoCE and ``gpu-2`` only TCP, so pods on the ``transport: rdma`` class land on
``gpu-1`` every time, steered by the CSIStorageCapacity the external-provisioner publishes per segment from our
GetCapacity (the ``transport-rdma=false`` segment has none of that class), and both paths of each pod's volume
on its node are RDMA ones (their controllers' transport in the node's sysfs, read while the pod holds the volume);
a claim larger than the capacity stays Pending with the scheduler's reason, and so does a pod that needs more
volumes on one node than the limit each node plugin publishes in its CSINode. Each test sets up what it needs and
removes it."""

from __future__ import annotations

from functools import partial

import pytest

from lab.fabric import Fabric
from lab.kube.cluster import DRIVER, NAMESPACE, KubeCluster
from lab.kube.layout import BY_NAME, GPUS
from tests.k8s.workloads import RDMA_KEY
from tests.support.kube import NS, container_exec, file_in, phase, pod, pvc, termination_message, wait_for

pytestmark = pytest.mark.lab

RDMA_SC = "lab-rdma"
LIMIT = 16  # the node plugin's --max-volumes-per-node in ci/lab-values.yaml
TRIES = 3
CHECK = (
    "set -e; dd if=/dev/urandom of=/data/blob bs=1M count=4 2>/dev/null; sync; "
    "grep -q ' /data ' /proc/mounts; sha256sum /data/blob | cut -d' ' -f1 > /dev/termination-log"
)
#: CHECK, then the volume held until the test has read its paths on the node (``/data/go``)
HOLD = CHECK + "; until [ -e /data/go ]; do sleep 1; done"


def _capacities(kube: KubeCluster, sc: str) -> dict[str, int]:
    """``transport-rdma`` value of each segment -> the bytes its CSIStorageCapacity of ``sc`` publishes."""
    out: dict[str, int] = {}
    for cap in kube.cp.get("csistoragecapacities", "-n", NAMESPACE)["items"]:
        if cap["storageClassName"] != sc:
            continue
        labels = cap.get("nodeTopology", {}).get("matchLabels", {})
        out[labels.get(RDMA_KEY, "")] = _bytes(cap.get("capacity", "0"))
    return out


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


def _cleanup(kube: KubeCluster, *names: str) -> None:
    kube.kubectl("-n", NS, "delete", *(f"pod/{n}" for n in names), "--ignore-not-found", "--wait=true", timeout=300)
    kube.kubectl("-n", NS, "delete", *(f"pvc/{n}" for n in names), "--ignore-not-found", "--wait=true", timeout=300)


def test_rdma_pods_land_on_the_rdma_node_every_time(kube: KubeCluster) -> None:
    rdma = [m.name for m in BY_NAME.values() if m.rdma and m.name in GPUS]
    assert rdma == [GPUS[0]], rdma

    def both() -> dict[str, int] | None:
        found = _capacities(kube, RDMA_SC)
        return found if {"true", "false"} <= found.keys() else None

    caps = wait_for("CSIStorageCapacity of lab-rdma for both segments", both, 300, 3)
    assert caps["true"] > 0 and caps["false"] == 0, caps
    names = [f"rdma-{i}" for i in range(TRIES)]
    try:
        objects = [o for n in names for o in (pvc(n, RDMA_SC), pod(n, n, HOLD))]
        kube.cp.apply({"apiVersion": "v1", "kind": "List", "items": objects})
        transports = {}
        for n in names:  # while the pod holds its volume: how its node reaches it (the node's own sysfs)
            wait_for(f"pod {n} wrote its blob", partial(_holding, kube, n), 600, 3)
            transports[n] = _transports(kube, n)
            container_exec(kube, n, ["touch", "/data/go"])
        for n in names:
            done = wait_for(f"pod {n} Succeeded", partial(_succeeded, kube, n), 600, 3)
            assert len(termination_message(done)) == 64, done["status"]
        print(f"rdma pods' paths on their node: {transports}")
        assert all(t == ["rdma", "rdma"] for t in transports.values()), transports  # both portals, over RDMA
        placed = {n: kube.node_of(n, NS) for n in names}
        print(f"rdma pods placed: {placed}; capacity per transport-rdma segment: {caps}")
        assert set(placed.values()) == {GPUS[0]}, placed
        for n in names:  # the volume's nodes are the RDMA segment's
            pv = kube.cp.get("pv", kube.cp.get("pvc", "-n", NS, n)["spec"]["volumeName"])
            terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
            exprs = [e for t in terms for e in t["matchExpressions"]]
            assert {"key": RDMA_KEY, "operator": "In", "values": ["true"]} in exprs, exprs
    finally:
        _cleanup(kube, *names)


def _holding(kube: KubeCluster, name: str) -> bool:
    """True once pod ``name`` runs and has written its checksum (it then holds its volume until ``/data/go``)."""
    state = phase(kube, "pod", name)
    if state == "Failed":
        raise AssertionError(f"pod {name} failed: {kube.cp.get('pod', '-n', NS, name)['status']}")
    return state == "Running" and bool(file_in(kube, name, "/dev/termination-log").strip())


def _transports(kube: KubeCluster, name: str) -> list[str]:
    """The transport of each path (controller) of the volume of pod ``name``'s claim, on the pod's node."""
    pv = kube.cp.get("pv", kube.cp.get("pvc", "-n", NS, name)["spec"]["volumeName"])
    paths = Fabric(kube.vm(kube.node_of(name, NS))).paths(pv["spec"]["csi"]["volumeAttributes"]["nqn"])
    return sorted(p.transport for p in paths)


def _succeeded(kube: KubeCluster, name: str) -> dict[str, object] | None:
    p = kube.cp.get("pod", "-n", NS, name)
    if p["status"].get("phase") == "Failed":
        raise AssertionError(f"pod {name} failed: {p['status']}")
    return dict(p) if p["status"].get("phase") == "Succeeded" else None


def test_a_claim_larger_than_the_capacity_stays_pending_with_the_reason(kube: KubeCluster) -> None:
    caps = wait_for("CSIStorageCapacity of lab-tcp", lambda: _capacities(kube, "lab-tcp") or None, 300, 3)
    too_big = 2 * max(caps.values()) + (1 << 30)  # whole GiB, past every segment's capacity
    try:
        kube.cp.apply(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [pvc("huge", "lab-tcp", f"{too_big >> 30}Gi"), pod("huge", "huge", "true")],
            }
        )

        objects = kube.kubectl("get", "csistoragecapacities", "-n", NAMESPACE, "-o", "yaml")
        message = wait_for(f"the scheduler's reason (capacities: {objects})", partial(_unscheduled, kube, "huge"), 180)
        print(f"claim of {too_big >> 30} GiB against {caps}: {message}")
        assert f"{len(GPUS)} node(s) did not have enough free storage" in message, message
        assert kube.cp.get("pvc", "-n", NS, "huge")["status"]["phase"] == "Pending"
    finally:
        _cleanup(kube, "huge")


def test_the_per_node_volume_limit_keeps_a_pod_with_more_volumes_pending(kube: KubeCluster) -> None:
    """The node plugin's ``--max-volumes-per-node`` (``ci/lab-values.yaml``) is in each GPU node's CSINode, and
    the scheduler holds a pod that would need more volumes on one node than that, naming the limit; none of its
    WaitForFirstConsumer claims gets a volume."""
    limits = {
        g: next(d for d in kube.cp.get("csinode", g)["spec"]["drivers"] if d["name"] == DRIVER)["allocatable"]["count"]
        for g in GPUS
    }
    assert limits == dict.fromkeys(GPUS, LIMIT), limits
    names = [f"many-{i}" for i in range(LIMIT + 1)]
    many = pod("many", names[0], "true")
    many["spec"]["volumes"] = [{"name": n, "persistentVolumeClaim": {"claimName": n}} for n in names]
    many["spec"]["containers"][0]["volumeMounts"] = [{"name": n, "mountPath": f"/{n}"} for n in names]
    try:
        kube.cp.apply({"apiVersion": "v1", "kind": "List", "items": [*(pvc(n, "lab-tcp") for n in names), many]})
        message = wait_for("the scheduler's reason", lambda: _unscheduled(kube, "many"), 180)
        print(f"a pod with {LIMIT + 1} volumes, limit {LIMIT} per node: {message}")
        assert f"{len(GPUS)} node(s) exceed max volume count" in message, message
        phases = {kube.cp.get("pvc", "-n", NS, n)["status"]["phase"] for n in names}
        assert phases == {"Pending"}, phases
    finally:
        kube.kubectl("-n", NS, "delete", "pod/many", *(f"pvc/{n}" for n in names), "--ignore-not-found",
                     "--wait=true", timeout=300)  # fmt: skip


def _unscheduled(kube: KubeCluster, name: str) -> str | None:
    for cond in kube.cp.get("pod", "-n", NS, name)["status"].get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "False" and cond.get("message"):
            return str(cond["message"])
    return None
