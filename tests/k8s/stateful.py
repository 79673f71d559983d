"""A StatefulSet pod with its own claim that keeps its data across moves between the GPU nodes (the node-loss
scenario, ``test_node_loss.py``), and what the cluster says of its volume: which node it is attached to and which
hosts the storage node allows on its subsystem."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lab.kube.cluster import KubeCluster
from lab.kube.layout import GPUS, STORAGE
from tests.k8s.workloads import SC
from tests.support.kube import NS, file_in, phase, pod_spec, wait_for

FIRST, SECOND = GPUS
#: the first start writes a blob and its checksum; every start says what it finds
KEEP = (
    "if [ ! -f /data/blob ]; then dd if=/dev/urandom of=/data/blob bs=1M count=16 2>/dev/null; "
    "sha256sum /data/blob | cut -d' ' -f1 > /data/written; sync; fi; "
    "sha256sum /data/blob | cut -d' ' -f1 > /tmp/found; sleep 100000"
)


def stateful_set(name: str, script: str, prefer: str) -> dict[str, object]:
    """One replica with its own claim (``data-<name>-0``), preferring node ``prefer`` (not requiring it)."""
    spec = pod_spec("unused", script, restart="Always")
    spec["volumes"] = []
    spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    spec["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}]
                    },
                }
            ]
        }
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "storageClassName": SC,
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        },
    }


@contextmanager
def stateful_pod(kube: KubeCluster, name: str, script: str, ready: str) -> Iterator[str]:
    """StatefulSet ``name`` (``script``, preferring ``gpu-1``) with its pod Running on ``gpu-1`` and its file
    ``ready`` made; the pod's name. ``gpu-2`` is cordoned until the pod runs: a preference alone lost to the
    scheduler once (right after an upgrade, ``gpu-1``'s segment was briefly without storage capacity). Afterwards
    both GPU nodes are uncordoned and the set, its pod and claim removed."""
    kube.kubectl("cordon", SECOND)
    kube.cp.apply(stateful_set(name, script, FIRST))
    pod_name = f"{name}-0"
    try:
        wait_for(f"{pod_name} Running", lambda: phase(kube, "pod", pod_name) == "Running", 600, 3)
        kube.kubectl("uncordon", SECOND)
        assert kube.node_of(pod_name, NS) == FIRST
        wait_for(f"{ready} in {pod_name}", lambda: file_in(kube, pod_name, ready).strip(), 120)
        yield pod_name
    finally:
        for node in GPUS:
            kube.kubectl("uncordon", node, check=False)
        kube.kubectl("-n", NS, "delete", f"statefulset/{name}", "--ignore-not-found", "--wait=true", timeout=300)
        kube.kubectl("-n", NS, "delete", f"pod/{pod_name}", "--ignore-not-found", "--wait=true", timeout=300)
        kube.kubectl("-n", NS, "delete", f"pvc/data-{pod_name}", "--ignore-not-found", "--wait=true", timeout=300)


def allowed_hosts(kube: KubeCluster, pv: str) -> list[str]:
    """The host NQNs allowed on the subsystem of volume ``pv`` on the storage node."""
    nqn = kube.cp.get("pv", pv)["spec"]["csi"]["volumeAttributes"]["nqn"]
    return kube.vm(STORAGE).run(["ls", f"/sys/kernel/config/nvmet/subsystems/{nqn}/allowed_hosts"], 10).out.split()


def attached_to(kube: KubeCluster, pv: str) -> list[str]:
    return [
        va["spec"]["nodeName"]
        for va in kube.cp.get("volumeattachments")["items"]
        if va["spec"]["source"].get("persistentVolumeName") == pv and va.get("status", {}).get("attached")
    ]
