"""What the Kubernetes scenarios apply: claims, Jobs and pods, with the shell each pod runs (``workloads()`` is
applied in one go by the ``started`` fixture). The classes they use come with the driver's Helm release
(``deploy/helm/nvmeof-csi/ci/lab-values.yaml``: StorageClasses ``lab-tcp`` and ``lab-nowhere``,
VolumeAttributesClasses ``lab-slow``, ``lab-fast`` and ``lab-bytes``, VolumeSnapshotClass ``lab-snap``)."""

from __future__ import annotations

from lab.kube.cluster import KubeCluster
from tests.support.kube import NS, container_exec, job, pod, pvc

SC = "lab-tcp"
TOPOLOGY_KEY = "topology.csi.nvmeof.io/fabric"
RDMA_KEY = "topology.csi.nvmeof.io/transport-rdma"
WRITE = (
    "set -e; dd if=/dev/urandom of=/data/blob bs=1M count=32 2>/dev/null; sync; "
    "sha256sum /data/blob | cut -d' ' -f1 > /dev/termination-log"
)
SLOW, FAST = 20, 36  # read IOPS limits of lab-slow and lab-fast (lab-values.yaml): well below the 4k QD1 rate
# one pod reaches beside the other scenarios on the emulated VMs (on slow evenings: limit 8 gave 5.0 IOPS, 20 was
# in bounds twice, 24 gave 20.1, 60 gave 42)
#: the read bandwidth limit of lab-bytes: ten of READS' 4 KiB reads a second, well below what the pod reaches
READ_BPS = 40960
READ = "set -e; sha256sum /data/blob | cut -d' ' -f1 > /dev/termination-log"
RAW_IO = (
    "set -e; dd if=/dev/urandom of=/tmp/in bs=1M count=8 2>/dev/null; "
    "dd if=/tmp/in of=/dev/xvda bs=1M oflag=direct conv=fsync 2>/dev/null; "
    "dd if=/dev/xvda of=/tmp/out bs=1M count=8 iflag=direct 2>/dev/null; "
    "a=$(sha256sum /tmp/in | cut -d' ' -f1); b=$(sha256sum /tmp/out | cut -d' ' -f1); "
    'echo "$a $b" > /dev/termination-log; test "$a" = "$b"'
)
#: a looping pod waits for ``/data/go`` (``start()`` in its test) before its I/O: a loop started with the other
#: workloads would keep the emulated machines busy through every scenario before its own
GATE = "until [ -e /data/go ]; do sleep 2; done; "
STEADY = (
    'echo "0 0" > /data/progress; ' + GATE + "i=0; e=0; while true; do i=$((i+1)); "
    "if dd if=/dev/urandom of=/data/f.$((i % 4)) bs=64k count=4 conv=fsync 2>/dev/null; then :; "
    'else e=$((e+1)); fi; echo "$i $e" > /data/progress.new; mv /data/progress.new /data/progress; sleep 0.2; done'
)
READS = (
    "dd if=/dev/urandom of=/data/f bs=1M count=16 2>/dev/null; sync; "
    + GATE
    + "while true; do dd if=/data/f of=/dev/null bs=4k iflag=direct 2>/dev/null; done"
)


def start(kube: KubeCluster, pod_name: str) -> None:
    """Open the ``GATE`` of a running looping pod: its I/O begins within 2 s."""
    container_exec(kube, pod_name, ["touch", "/data/go"])


def workloads() -> list[dict[str, object]]:
    """Every claim, Job and pod the scenarios use, in one list."""
    tuned = pvc("tuned", SC)
    tuned["spec"]["volumeAttributesClassName"] = "lab-slow"
    raw_io = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "raw-io", "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {"spec": {**pod("x", "raw", RAW_IO, block=True)["spec"]}}},
    }
    return [
        pvc("train-data", SC),
        job("writer", "train-data", WRITE + "; sleep 5"),  # test 2 (and 5)
        pvc("nowhere", "lab-nowhere"),
        pod("nowhere", "nowhere", "true"),  # test 3
        pvc("grow", SC, "1Gi"),
        pod("grower", "grow", "sleep 100000"),  # test 4
        pvc("raw", SC, block=True),
        raw_io,  # test 6
        pvc("steady", SC),
        pod("steady-io", "steady", STEADY),  # test 7 (helm upgrade under I/O)
        tuned,
        pod("tuned-io", "tuned", READS),  # test 7b
    ]
