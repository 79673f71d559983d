"""Kubernetes 1.37 drives the driver: the scheduler, kubelet and the real CSI sidecars are the clients, on the
real kernel fabric between the lab VMs (the agent on ``storage-1``, workloads on ``gpu-1`` and ``gpu-2``). Every scenario's claims and pods are applied at once (``started``), so their
provisioning, attaching, staging and pod starts run side by side as they would in a cluster, and each scenario
then checks its own; any one of them runs alone too (``pytest tests/k8s -k test_5``). Each prints its
duration."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from lab.kube.cluster import CHART, DRIVER, FABRIC, LAB_VALUES, NAMESPACE, NEXT_TAG, RELEASE, KubeCluster
from lab.kube.layout import GPUS, MACHINES, STORAGE
from tests.k8s.lifecycle import driver_pods, progress, restarted_logs, roll_timeline
from tests.k8s.workloads import FAST, RDMA_KEY, READ, READ_BPS, SC, SLOW, TOPOLOGY_KEY, start, workloads
from tests.support.kube import (
    NS,
    container_exec,
    container_id,
    events_of,
    job,
    job_pod,
    phase,
    pvc,
    termination_message,
    wait_for,
    wait_job,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def started(kube: KubeCluster) -> KubeCluster:
    """The cluster with every scenario's objects applied in one go."""
    kube.cp.apply({"apiVersion": "v1", "kind": "List", "items": workloads()})
    return kube


@pytest.fixture(scope="module")
def written(started: KubeCluster) -> str:
    """The checksum the training Job ``writer`` wrote to ``train-data`` (it has succeeded)."""
    written = termination_message(wait_job(started, "writer"))
    assert len(written) == 64, f"writer's checksum: {written!r}"
    return written


@pytest.fixture(autouse=True)
def timed(report: Callable[[str, str], None], request: pytest.FixtureRequest) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    report(f"{request.node.name} duration", f"{time.monotonic() - t0:.1f}s")


def test_helm_install_runs_every_driver_pod_and_registers_the_gpu_nodes(kube: KubeCluster) -> None:
    pods = kube.pods()
    names = sorted(p["metadata"]["name"].rsplit("-", 1)[0] for p in pods)
    assert any(n.startswith("nvmeof-csi-controller") for n in names), names
    for p in pods:
        conds = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
        assert conds.get("Ready") == "True", f"{p['metadata']['name']} not Ready: {p['status']}"
    placed = {(p["metadata"]["labels"].get("app.kubernetes.io/name"), p["spec"]["nodeName"]) for p in pods}
    expected = {("nvmeof-csi-agent", STORAGE), ("nvmeof-csi-controller", STORAGE)}
    assert expected | {("nvmeof-csi-node", g) for g in GPUS} <= placed, placed
    for m in MACHINES:
        drivers = {d["name"]: d for d in kube.cp.get("csinode", m.name)["spec"]["drivers"] or []}
        labels = kube.cp.get("node", m.name)["metadata"]["labels"]
        if m.storage:  # no node plugin on the storage node: it publishes no topology
            assert DRIVER not in drivers and TOPOLOGY_KEY not in labels, (m.name, drivers, labels)
            continue
        assert DRIVER in drivers, f"CSINode {m.name} lists {list(drivers)}"
        assert drivers[DRIVER]["nodeID"] == m.host_nqn, drivers[DRIVER]
        assert TOPOLOGY_KEY in drivers[DRIVER]["topologyKeys"], drivers[DRIVER]
        assert labels.get(TOPOLOGY_KEY) == FABRIC, labels
        assert labels.get(RDMA_KEY) == ("true" if m.rdma else "false"), (m.name, labels)


def test_a_training_job_writes_and_a_second_pod_reads(started: KubeCluster) -> None:
    kube = started
    attached: set[str] = set()  # PersistentVolumes seen attached while the writer ran

    def done() -> dict[str, object] | None:
        for va in kube.cp.get("volumeattachments")["items"]:
            if va.get("status", {}).get("attached"):
                attached.add(va["spec"]["source"].get("persistentVolumeName", ""))
        status = kube.cp.get("job", "-n", NS, "writer").get("status", {})
        assert not status.get("failed"), job_pod(kube, "writer")["status"]
        return job_pod(kube, "writer") if status.get("succeeded") else None

    writer = wait_for("job writer succeeded", done, 900)
    written = termination_message(writer)
    assert len(written) == 64, f"writer's checksum: {written!r}"
    pv_name = kube.cp.get("pvc", "-n", NS, "train-data")["spec"]["volumeName"]
    pv = kube.cp.get("pv", pv_name)
    assert pv["spec"]["csi"]["driver"] == DRIVER
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    exprs = [e for t in terms for e in t["matchExpressions"]]
    assert {"key": TOPOLOGY_KEY, "operator": "In", "values": [FABRIC]} in exprs, exprs
    assert pv_name in attached, f"the writer's volume {pv_name} was not seen attached while it ran ({attached})"
    kube.cp.apply(job("reader", "train-data", READ))
    assert termination_message(wait_job(kube, "reader")) == written


def test_a_claim_on_an_unreachable_fabric_stays_pending_with_a_reason(started: KubeCluster) -> None:
    kube = started

    def reason() -> str | None:
        p = kube.cp.get("pod", "-n", NS, "nowhere")
        for cond in p["status"].get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False" and cond.get("message"):
                return str(cond["message"])
        return None

    message = wait_for("the scheduler's reason", reason, 120)
    assert f"0/{len(MACHINES)} nodes are available" in message, message
    assert f"{len(GPUS)} node(s) didn't find available persistent volumes to bind" in message, message
    time.sleep(10)  # still nothing: not bound, not scheduled, no volume created (the others were meanwhile)
    assert phase(kube, "pod", "nowhere") == "Pending"
    assert phase(kube, "pvc", "nowhere") == "Pending"
    print(f"scheduler: {message}")
    kube.kubectl("-n", NS, "delete", "pod/nowhere", "pvc/nowhere", "--wait=true", timeout=180)


def test_online_expansion_grows_the_filesystem_in_the_running_pod(started: KubeCluster) -> None:
    kube = started
    wait_for("pod grower Running", lambda: phase(kube, "pod", "grower") == "Running", 900)

    def size_kib() -> int:
        out = container_exec(kube, "grower", ["df", "-k", "/data"]).splitlines()[-1].split()
        return int(out[1])

    before = size_kib()
    assert before < 1100 * 1024, before
    kube.kubectl(
        "-n",
        NS,
        "patch",
        "pvc",
        "grow",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"resources": {"requests": {"storage": "2Gi"}}}}),
    )
    wait_for("filesystem in the pod grown past 1.5 GiB", lambda: size_kib() > 1536 * 1024, 600, 3)
    wait_for(
        "PVC capacity 2Gi",
        lambda: kube.cp.get("pvc", "-n", NS, "grow")["status"].get("capacity", {}).get("storage") == "2Gi",
        300,
    )
    print(f"df in the pod: {before} KiB -> {size_kib()} KiB")
    kube.kubectl("-n", NS, "delete", "pod/grower", "--wait=true", timeout=300)


#: a clone's pod: the checksum it found, then the clone's blob overwritten (the source must not change)
CLONE_RW = (
    "set -e; a=$(sha256sum /data/blob | cut -d' ' -f1); "
    "dd if=/dev/urandom of=/data/blob bs=1M count=32 conv=fsync 2>/dev/null; echo $a > /dev/termination-log"
)


def test_a_snapshot_then_a_volume_from_it_and_a_clone_of_the_source(started: KubeCluster, written: str) -> None:
    """A VolumeSnapshot of the training data and a claim restored from it hold the written bytes; a PVC-to-PVC
    clone of the same claim too, and overwriting the clone leaves the source's bytes as they were."""
    kube = started  # VolumeSnapshotClass lab-snap comes with the release (lab-values.yaml)
    source = {"kind": "PersistentVolumeClaim", "name": "train-data"}
    kube.cp.apply(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "snapshot.storage.k8s.io/v1",
                    "kind": "VolumeSnapshot",
                    "metadata": {"name": "train-snap", "namespace": NS},
                    "spec": {
                        "volumeSnapshotClassName": "lab-snap",
                        "source": {"persistentVolumeClaimName": "train-data"},
                    },
                },
                pvc("cloned", SC, source=source),
                job("clone-rw", "cloned", CLONE_RW),
            ],
        }
    )
    wait_for(
        "snapshot ready",
        lambda: kube.cp.get("volumesnapshot", "-n", NS, "train-snap").get("status", {}).get("readyToUse"),
        600,
    )
    kube.cp.apply(
        pvc(
            "restored",
            SC,
            source={"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "train-snap"},
        )
    )
    kube.cp.apply(job("restored-reader", "restored", READ))
    assert termination_message(wait_job(kube, "restored-reader")) == written
    assert termination_message(wait_job(kube, "clone-rw")) == written  # the clone held the source's bytes
    kube.cp.apply(job("source-reread", "train-data", READ))
    assert termination_message(wait_job(kube, "source-reread")) == written  # the clone's writes stayed in it


def test_a_block_volume_is_written_and_read_back(started: KubeCluster) -> None:
    a, b = termination_message(wait_job(started, "raw-io")).split()
    assert a == b and len(a) == 64


def test_an_attributes_class_change_moves_the_running_pods_iops_and_bandwidth(started: KubeCluster) -> None:
    """The QoS issue's Kubernetes scenario: a VolumeAttributesClass change on a bound PVC reaches
    ControllerModifyVolume through the real external-resizer; the running pod's io.max and its measured read
    IOPS (the kernel's own per-cgroup counters) move to the new limit without a restart; then a class that adds a
    read bandwidth limit (``lab-bytes``; the IOPS limit it leaves out keeps its value, and allows four times the
    bytes): the pod's measured read bytes per second are within 5 % of it."""
    kube = started
    wait_for("pod tuned-io Running", lambda: phase(kube, "pod", "tuned-io") == "Running", 900)
    start(kube, "tuned-io")
    uid = kube.cp.get("pod", "-n", NS, "tuned-io")["metadata"]["uid"]
    vm = kube.vm(kube.node_of("tuned-io", NS))
    cgroup = vm.sh(
        f"ls -d /sys/fs/cgroup/kubepods/*/pod{uid} /sys/fs/cgroup/kubepods/pod{uid} 2>/dev/null", 10
    ).out.split()
    assert len(cgroup) == 1, f"pod cgroup of {uid}: {cgroup}"

    def io_max() -> str:
        return vm.check(["cat", f"{cgroup[0]}/io.max"], 10).strip()

    def measured(field: str = "rios", seconds: float = 15.0) -> float:
        device = io_max().split()[0]

        def count() -> int:
            for line in vm.check(["cat", f"{cgroup[0]}/io.stat"], 10).splitlines():
                if line.startswith(device + " "):
                    return int(dict(f.split("=") for f in line.split()[1:])[field])
            return 0

        a, t0 = count(), time.monotonic()
        time.sleep(seconds)
        b, t1 = count(), time.monotonic()
        return (b - a) / (t1 - t0)

    def change_class(name: str) -> float:
        """Seconds until the PVC's current class is ``name``."""
        t0 = time.monotonic()
        patch = json.dumps({"spec": {"volumeAttributesClassName": name}})
        kube.kubectl("-n", NS, "patch", "pvc", "tuned", "--type=merge", "-p", patch)
        wait_for(
            f"PVC's current class {name}",
            lambda: kube.cp.get("pvc", "-n", NS, "tuned")["status"].get("currentVolumeAttributesClassName") == name,
            300,
        )
        return time.monotonic() - t0

    wait_for(f"io.max riops={SLOW}", lambda: f"riops={SLOW}" in io_max(), 120)
    slow = measured()
    container = container_id(kube, "tuned-io")
    t0 = time.monotonic()
    modified = change_class("lab-fast")
    wait_for(f"io.max riops={FAST}", lambda: f"riops={FAST}" in io_max(), 60, 0.5)
    in_force = time.monotonic() - t0
    fast = measured()
    print(
        f"io.max {io_max()!r}; read IOPS {slow:.1f} (limit {SLOW}) -> {fast:.1f} (limit {FAST}); "
        f"ModifyVolume done {modified:.1f}s, io.max in force {in_force:.1f}s after the PVC edit"
    )
    assert SLOW * 0.8 <= slow <= SLOW * 1.1, slow
    assert FAST * 0.8 <= fast <= FAST * 1.1, fast
    change_class("lab-bytes")
    wait_for(f"io.max rbps={READ_BPS}", lambda: f"rbps={READ_BPS}" in io_max(), 60, 0.5)
    bps = measured("rbytes")
    print(f"io.max {io_max()!r}; read bytes/s {bps:.0f} (limit {READ_BPS})")
    assert READ_BPS * 0.95 <= bps <= READ_BPS * 1.05, bps
    assert container_id(kube, "tuned-io") == container
    kube.kubectl("-n", NS, "delete", "pod/tuned-io", "--wait=true", timeout=300)


def pv_of(kube: KubeCluster, claim: str) -> str:
    return str(kube.cp.get("pvc", "-n", NS, claim)["spec"]["volumeName"])


def test_helm_upgrade_under_io_replaces_every_pod_and_loses_no_write(
    started: KubeCluster, report: Callable[[str, str], None]
) -> None:
    """``helm upgrade`` to a new driver image tag with changed values while a pod writes with fsync: every pod of
    the release (node plugin, agent, controller, snapshot-controller) is replaced, the writer sees no I/O error
    and keeps going, its container and its mount stay; once the pod is deleted its mount is gone."""
    kube = started
    wait_for("pod steady-io Running", lambda: phase(kube, "pod", "steady-io") == "Running", 900)
    start(kube, "steady-io")
    wait_for("I/O under way", lambda: progress(kube, "steady-io")[0] > 5, 120)
    before = driver_pods(kube)
    vm = kube.vm(kube.node_of("steady-io", NS))
    container = container_id(kube, "steady-io")
    at_upgrade, t0 = progress(kube, "steady-io"), time.monotonic()
    kube.helm(
        "upgrade", RELEASE, str(CHART), "--values", str(LAB_VALUES), "--set", f"images.driver.tag={NEXT_TAG}",
        "--set", "controller.timeout=90s", "--set", "snapshotController.resources.limits.memory=320Mi",
    )  # fmt: skip
    kube.wait_driver_ready()

    def replaced() -> dict[str, dict[str, str]] | None:
        pods = driver_pods(kube)
        return pods if pods.keys().isdisjoint(before) else None

    after = wait_for("every pod of the release replaced", replaced, 600)
    rolled = time.monotonic() - t0
    time.sleep(10)
    written = progress(kube, "steady-io")
    report(
        "helm upgrade under I/O",
        f"{len(after)} pods replaced in {rolled:.0f}s; (writes, errors) {at_upgrade} -> {written}",
    )
    report("helm upgrade timeline", roll_timeline(kube))
    for name, tail in restarted_logs(kube):
        report(f"the last run of {name} ended", tail)
    for name in after:
        if name.startswith("nvmeof-csi-controller"):
            report(f"events of {name}", events_of(kube, "Pod", name, NAMESPACE))
    assert len(after) == len(before), (before, after)
    images = {image for containers in after.values() for image in containers.values() if "nvmeof-csi:" in image}
    assert images == {f"localhost/nvmeof-csi:{NEXT_TAG}"}, images
    assert written[1] == 0, f"{written[1]} failed writes in the workload during the upgrade"
    assert written[0] > at_upgrade[0] + 10, (at_upgrade, written)
    assert container_id(kube, "steady-io") == container
    assert pv_of(kube, "steady") in vm.check(["cat", "/proc/mounts"], 10)
    history = json.loads(kube.helm("history", RELEASE, "-o", "json"))
    assert [h["status"] for h in history] == ["superseded", "deployed"], history
    kube.kubectl("-n", NS, "delete", "pod/steady-io", "--wait=true", timeout=300)
    mounts = vm.check(["cat", "/proc/mounts"], 10)
    assert "steady" not in mounts and pv_of(kube, "steady") not in mounts
