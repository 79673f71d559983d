"""Volumes move with their pods (Kubernetes across machines, point 3): a StatefulSet pod writes on ``gpu-1``;
``kubectl drain gpu-1`` evicts it, the StatefulSet controller recreates it, the scheduler puts it on ``gpu-2``,
and it finds its data there; the VolumeAttachment moved with it and ``gpu-1``'s host is no longer allowed on
the volume's subsystem on ``storage-1``. The test sets up what it needs and removes it (``gpu-1`` uncordoned)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from lab.kube.cluster import KubeCluster
from lab.kube.layout import BY_NAME, GPUS, STORAGE
from tests.k8s.workloads import SC
from tests.support.kube import NS, container_exec, file_in, phase, pod_spec, wait_for

pytestmark = pytest.mark.lab

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
    ``ready`` made; the pod's name. Afterwards ``gpu-1`` is uncordoned and the set, its pod and claim removed."""
    kube.cp.apply(stateful_set(name, script, FIRST))
    pod_name = f"{name}-0"
    try:
        wait_for(f"{pod_name} Running", lambda: phase(kube, "pod", pod_name) == "Running", 600, 3)
        assert kube.node_of(pod_name, NS) == FIRST
        wait_for(f"{ready} in {pod_name}", lambda: file_in(kube, pod_name, ready).strip(), 120)
        yield pod_name
    finally:
        kube.kubectl("uncordon", FIRST, check=False)
        kube.kubectl("-n", NS, "delete", f"statefulset/{name}", "--ignore-not-found", "--wait=true", timeout=300)
        kube.kubectl("-n", NS, "delete", f"pod/{pod_name}", "--ignore-not-found", "--wait=true", timeout=300)
        kube.kubectl("-n", NS, "delete", f"pvc/data-{pod_name}", "--ignore-not-found", "--wait=true", timeout=300)


@pytest.fixture
def mover(kube: KubeCluster) -> Iterator[str]:
    """StatefulSet ``mover`` Running on ``gpu-1`` with its data written; removed afterwards."""
    with stateful_pod(kube, "mover", KEEP, "/tmp/found") as name:
        yield name


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


def test_drain_moves_the_pod_and_its_volume_to_the_other_node(
    kube: KubeCluster, mover: str, report: Callable[[str, str], None]
) -> None:
    written = container_exec(kube, mover, ["cat", "/data/written"]).strip()
    pv = str(kube.cp.get("pvc", "-n", NS, "data-mover-0")["spec"]["volumeName"])
    assert attached_to(kube, pv) == [FIRST]
    assert BY_NAME[FIRST].host_nqn in allowed_hosts(kube, pv)
    old_uid = kube.cp.get("pod", "-n", NS, mover)["metadata"]["uid"]
    t0 = time.monotonic()
    kube.kubectl("drain", FIRST, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s", timeout=360)
    drained = time.monotonic() - t0

    def moved() -> bool:
        p = kube.cp.get("pod", "-n", NS, mover)
        return bool(p["metadata"]["uid"] != old_uid and p["status"].get("phase") == "Running")

    wait_for("mover-0 Running again", moved, 600, 2)
    running = time.monotonic() - t0
    assert kube.node_of(mover, NS) == SECOND
    found = wait_for("the moved pod read its data", lambda: file_in(kube, mover, "/tmp/found"), 120)
    assert found.strip() == written and len(written) == 64, (found, written)
    assert attached_to(kube, pv) == [SECOND]
    hosts = allowed_hosts(kube, pv)
    assert BY_NAME[FIRST].host_nqn not in hosts and BY_NAME[SECOND].host_nqn in hosts, hosts
    report("drain to moved pod Running", f"{running:.1f}s (drain itself {drained:.1f}s)")
    print(f"drain {FIRST}: pod on {SECOND} with its data after {running:.1f}s (drain returned at {drained:.1f}s)")
