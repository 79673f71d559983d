"""Gang-scheduled training on one data set (Kubernetes across machines, point 4): ``deploy/examples/
training-gang-job.yaml`` (a gang PodGroup of two, an Indexed Job of two workers, one per node) applied with the
lab's image, classes and sizes. Its ReadOnlyMany data set volume is filled from a real Alluxio on this host
(reached by the storage node through its QEMU forwards), so both workers read the same bytes on two nodes; each
checks every file against the data set's own checksum list and writes to its own scratch volume. With ``gpu-2``
cordoned, neither worker is bound to a node (all or nothing); uncordoned, both run, on different nodes."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.build import REPO
from lab.dataset_files import make_dataset
from lab.kube.cluster import DRIVER, KubeCluster
from lab.kube.layout import GPUS
from tests.k8s.conftest import ALLUXIO_PORTS
from tests.support.datasets import start_alluxio
from tests.support.kube import GPU_NODE, NS, WORKLOAD, termination_message, wait_for

pytestmark = pytest.mark.lab

EXAMPLE = REPO / "deploy" / "examples" / "training-gang-job.yaml"
DATASETS = Path("/tmp/nvmeof-csi-k8s-datasets")  # the under-store ci/lab-values.yaml lets the agent read
SC = "lab-dataset"
FILES = 60
WORK = (
    "set -e; cd /data; sha256sum -c SHA256SUMS > /dev/null; n=$(grep -c . SHA256SUMS); "
    "dd if=/dev/urandom of=/scratch/checkpoint bs=1M count=4 2>/dev/null; sync; "
    'echo "$JOB_COMPLETION_INDEX $n" > /dev/termination-log'
)


@pytest.fixture(scope="module")
def dataset(
    kube: KubeCluster, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """A generated data set with its ``SHA256SUMS`` in the under-store, and Alluxio running on the ports the VMs
    reach; the number of files."""
    root = DATASETS / "train"
    shutil.rmtree(DATASETS, ignore_errors=True)
    made = make_dataset(root, files=FILES)
    (root / "SHA256SUMS").write_text("".join(f"{digest}  {rel}\n" for rel, digest in sorted(made.checksums.items())))
    base = tmp_path_factory.mktemp("alluxio")
    cluster = start_alluxio(base / "cluster", base / "ufs", request.config.stash[ALLUXIO_PORTS])
    try:
        yield len(made.checksums)
    finally:
        cluster.stop()
        shutil.rmtree(DATASETS, ignore_errors=True)


def lab_objects() -> list[dict[str, Any]]:
    """The example's objects, in the lab: our namespace, image, classes and sizes, no GPU request."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = NS
        if doc["kind"] == "PersistentVolumeClaim":
            doc["spec"]["storageClassName"] = SC
            doc["spec"]["resources"]["requests"]["storage"] = "256Mi"
        if doc["kind"] == "Job":
            spec = doc["spec"]["template"]["spec"]
            spec["nodeSelector"] = GPU_NODE
            spec["terminationGracePeriodSeconds"] = 5
            (container,) = spec["containers"]
            container.update(image=WORKLOAD, imagePullPolicy="Never", command=["/bin/sh", "-c", WORK], args=[])
            container.pop("resources")
            scratch = next(v for v in spec["volumes"] if v["name"] == "scratch")
            claim = scratch["ephemeral"]["volumeClaimTemplate"]["spec"]
            claim["storageClassName"] = "lab-tcp"
            claim["resources"]["requests"]["storage"] = "256Mi"
    assert {d["kind"] for d in docs} == {"PersistentVolumeClaim", "PodGroup", "Job"}, EXAMPLE
    return docs


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": SC},
        "provisioner": DRIVER,
        "volumeBindingMode": "Immediate",
        "parameters": {
            "transport": "tcp",
            "csi.storage.k8s.io/fstype": "ext4",
            "dataset.uri": str(DATASETS / "train"),
            "dataset.path": "/datasets/train",
        },
    }


def workers(kube: KubeCluster, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.cp.get("pods", "-n", NS, "-l", f"job-name={job}")["items"]
    return items


def refused(pod: dict[str, Any]) -> bool:
    """Whether the scheduler tried ``pod`` and did not place it (its PodScheduled condition False)."""
    conditions = pod["status"].get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


def test_gang_of_two_reads_one_dataset_on_two_nodes_all_or_nothing(kube: KubeCluster, dataset: int) -> None:
    docs = lab_objects()
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    job = next(d for d in docs if d["kind"] == "Job")["metadata"]["name"]
    group = next(d for d in docs if d["kind"] == "PodGroup")["metadata"]["name"]
    name = claim["metadata"]["name"]
    try:
        kube.cp.apply(storage_class())
        t0 = time.monotonic()
        kube.cp.apply(claim)
        wait_for(f"data set claim {name} Bound", lambda: _bound(kube, name), 900, 3)
        filled = time.monotonic() - t0
        kube.kubectl("cordon", GPUS[1])
        kube.cp.apply({"apiVersion": "v1", "kind": "List", "items": [d for d in docs if d is not claim]})
        wait_for("both workers created", lambda: len(workers(kube, job)) == 2, 120)
        # one node free for one worker: the gang of two must not start at all. The scheduler's first attempt
        # decides (a broken gang binds one worker to the free node then); once it marked both unschedulable,
        # or after 30 s, neither may be bound
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(refused(p) for p in workers(kube, job)):
            time.sleep(2)
        held = workers(kube, job)
        assert all(not p["spec"].get("nodeName") for p in held), [p["spec"].get("nodeName") for p in held]
        assert all(p["status"].get("phase") == "Pending" for p in held), [p["status"] for p in held]
        kube.kubectl("uncordon", GPUS[1])
        t1 = time.monotonic()

        def succeeded() -> bool:
            status = kube.cp.get("job", "-n", NS, job).get("status", {})
            assert not status.get("failed"), [p["status"] for p in workers(kube, job)]
            return int(status.get("succeeded") or 0) == 2

        wait_for(f"job {job}: both workers succeeded", succeeded, 900, 3)
        done = workers(kube, job)
        nodes = sorted(p["spec"]["nodeName"] for p in done)
        said = sorted(termination_message(p) for p in done)
        print(f"data set filled from Alluxio and Bound in {filled:.1f}s; gang held while {GPUS[1]} was cordoned; "
              f"both workers done {time.monotonic() - t1:.1f}s after uncordon on {nodes}: {said}")  # fmt: skip
        assert nodes == sorted(GPUS), nodes
        assert said == [f"0 {dataset}", f"1 {dataset}"], said  # each worker checked every file of the list
    finally:
        kube.kubectl("uncordon", GPUS[1], check=False)
        kube.kubectl("-n", NS, "delete", f"job/{job}", "--ignore-not-found", "--wait=true", timeout=300)
        kube.kubectl("-n", NS, "delete", "pods", "-l", f"job-name={job}", "--wait=true", timeout=300)
        kube.kubectl("-n", NS, "delete", f"podgroup.scheduling.k8s.io/{group}", "--ignore-not-found", timeout=120)
        kube.kubectl("-n", NS, "delete", f"pvc/{name}", "--ignore-not-found", "--wait=true", timeout=300)
        kube.kubectl("delete", "storageclass", SC, "--ignore-not-found")


def _bound(kube: KubeCluster, claim: str) -> bool:
    return bool(kube.cp.get("pvc", "-n", NS, claim)["status"].get("phase") == "Bound")
