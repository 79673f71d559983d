"""A lost node is fenced, and a drained one hands its pods over (Kubernetes across machines, points 3 and 5; node
fencing's proof with a real API server): a StatefulSet writer on ``gpu-1``; ``gpu-1`` is cut from the control
plane only (its NIC to the API server loses its link) so that it goes NotReady while its storage links keep
working and its writer keeps writing; the operator applies the out-of-service taint; the pod is recreated and
Running on ``gpu-2`` with its data, the external-attacher's ControllerUnpublish of ``gpu-1`` fenced it (the
controller reads the taint: Kubernetes 1.37's attacher sends no CSI 1.14 reason), so from then on every write of
``gpu-1``'s writer fails, O_DIRECT and buffered, at once (the fence ended its controllers and the target refuses
their reconnects, so the host drops the paths), and the writer's tries keep growing while neither success count
does (a writer that merely hung would fail the test). Then ``gpu-1`` is power-cycled and the taint removed, and
``kubectl drain gpu-2`` evicts the pod: it runs on ``gpu-1`` again with its data, the VolumeAttachment moved
with it, ``gpu-2``'s host is no longer allowed on the subsystem, and ``gpu-1``'s fence on the volume was lifted
because it rebooted (a new boot ID). ``gpu-1`` was power-cut with the volume staged and a pod on it: after its
boot it holds the volume's two paths once (nothing left over, nothing doubled) under its own host NQN.

The writer keeps its counts in the container's own filesystem (``/tmp``), read through the node's VM channel,
which no fault here touches. Without fencing (``LAB_FENCE_ON=none``: the controller's ``--fence-on none``) it
fails: the unpublish only drops ``gpu-1`` from ``allowed_hosts`` and its live controllers keep writing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from lab.fabric import Fabric
from lab.kube.cluster import KubeCluster
from lab.kube.layout import BY_NAME, GPUS
from tests.k8s.stateful import KEEP, allowed_hosts, attached_to, stateful_pod
from tests.support.kube import NS, container_exec, container_id, crictl, events_of, file_in, wait_for

pytestmark = pytest.mark.lab

FIRST, SECOND = GPUS
TAINT = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
#: KEEP's data, then writes for ever, O_DIRECT and buffered (fsync); (tries, O_DIRECT writes that succeeded,
#: buffered ones that did) in /tmp/progress, never on the volume. A write that hangs counts as no success.
WRITER = KEEP.replace(
    "sleep 100000",
    "i=0; d=0; b=0; while true; do i=$((i+1)); "
    "dd if=/dev/urandom of=/data/direct bs=64k count=4 oflag=direct 2>/dev/null && d=$((d+1)); "
    "dd if=/dev/urandom of=/data/buffered bs=64k count=4 conv=fsync 2>/dev/null && b=$((b+1)); "
    'echo "$i $d $b" > /tmp/progress.new; mv /tmp/progress.new /tmp/progress; sleep 0.2; done',
)


def progress(kube: KubeCluster, node: str, container: str) -> tuple[int, int, int]:
    """(tries, O_DIRECT successes, buffered successes) of the writer's container on ``node``, read through
    containerd on that node (no API server involved)."""
    i, d, b = crictl(kube, node, "exec", container, "cat", "/tmp/progress", timeout=60).split()
    return int(i), int(d), int(b)


@pytest.fixture
def writer(kube: KubeCluster) -> Iterator[str]:
    """StatefulSet ``lost`` writing on ``gpu-1``; afterwards ``gpu-1``'s way to the API and its taint are
    restored before the set is removed (and both nodes uncordoned)."""
    with stateful_pod(kube, "lost", WRITER, "/tmp/progress") as name:
        try:
            yield name
        finally:
            kube.restore_api(FIRST)
            kube.kubectl("taint", "node", FIRST, "node.kubernetes.io/out-of-service-", check=False)


def test_a_node_cut_from_the_control_plane_is_fenced_and_its_pod_moves_with_its_data(
    kube: KubeCluster, writer: str, report: Callable[[str, str], None]
) -> None:
    written = container_exec(kube, writer, ["cat", "/data/written"]).strip()
    container = container_id(kube, writer)
    pv = str(kube.cp.get("pvc", "-n", NS, "data-lost-0")["spec"]["volumeName"])
    old_uid = kube.cp.get("pod", "-n", NS, writer)["metadata"]["uid"]
    kube.cut_api(FIRST)
    t_cut = time.monotonic()

    def not_ready() -> bool:
        conds = {c["type"]: c["status"] for c in kube.cp.get("node", FIRST)["status"].get("conditions", [])}
        return conds.get("Ready") != "True"

    wait_for(f"{FIRST} NotReady", not_ready, 300, 3)
    before = progress(kube, FIRST, container)
    time.sleep(3)
    during = progress(kube, FIRST, container)  # cut off and still writing, every write landing
    assert during[1] > before[1] and during[2] > before[2], (before, during)
    kube.kubectl("taint", "node", FIRST, TAINT)
    t_taint = time.monotonic()

    def moved_from(uid: str) -> Callable[[], bool]:
        def moved() -> bool:
            p = kube.cp.get("pod", "-n", NS, writer)
            return bool(p["metadata"]["uid"] != uid and p["status"].get("phase") == "Running")

        return moved

    wait_for("lost-0 Running again", moved_from(old_uid), 900, 3)
    running = time.monotonic() - t_taint
    assert kube.node_of(writer, NS) == SECOND
    assert attached_to(kube, pv) == [SECOND]
    hosts = allowed_hosts(kube, pv)
    assert BY_NAME[FIRST].host_nqn not in hosts and BY_NAME[SECOND].host_nqn in hosts, hosts
    found = wait_for("the moved pod read its data", lambda: file_in(kube, writer, "/tmp/found"), 120)
    assert found.strip() == written and len(written) == 64, (found, written)
    # gpu-1's writer, still running and still connected by its storage links: from the fence on, nothing lands;
    # it keeps trying (each write fails), so a hung writer cannot pass for a fenced one
    fenced = progress(kube, FIRST, container)
    time.sleep(10)
    after = progress(kube, FIRST, container)
    print(f"{FIRST} after the fence (tries, O_DIRECT ok, buffered ok): {fenced} -> {after} in 10 s")
    assert after[1:] == fenced[1:], (fenced, after)
    assert after[0] >= fenced[0] + 2, f"the fenced writer stopped trying (hung?): {fenced} -> {after}"
    report("taint to moved pod Running", f"{running:.1f}s (cut to taint {t_taint - t_cut:.1f}s)")
    # the node comes back: power-cycled, its way to the API restored, the taint removed; then gpu-2 is drained
    # for maintenance and the pod moves back to gpu-1 with its volume (its fence lifted: gpu-1 rebooted)
    t_restart = time.monotonic()
    kube.restart_node(FIRST)
    restarted = time.monotonic() - t_restart
    kube.kubectl("taint", "node", FIRST, "node.kubernetes.io/out-of-service-")
    on_second = kube.cp.get("pod", "-n", NS, writer)["metadata"]["uid"]
    t_drain = time.monotonic()
    # --force: a pod of another scenario left on gpu-2 without a controller (a run of some scenarios only) goes too
    kube.kubectl("drain", SECOND, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=300s",
                 timeout=360)  # fmt: skip
    drained = time.monotonic() - t_drain
    wait_for("lost-0 Running on the returned node", moved_from(on_second), 600, 2)
    back = time.monotonic() - t_drain
    assert kube.node_of(writer, NS) == FIRST
    found = wait_for("the pod read its data on the returned node", lambda: file_in(kube, writer, "/tmp/found"), 120)
    assert found.strip() == written, (found, written)
    assert attached_to(kube, pv) == [FIRST]
    hosts = allowed_hosts(kube, pv)
    assert BY_NAME[FIRST].host_nqn in hosts and BY_NAME[SECOND].host_nqn not in hosts, hosts
    # gpu-1 was power-cut with the volume staged: after its boot it holds the volume's two paths once, under the
    # host NQN it had (no controller left over from before, none doubled, no identity of another node)
    nqn = kube.cp.get("pv", pv)["spec"]["csi"]["volumeAttributes"]["nqn"]
    paths = Fabric(kube.vm(FIRST)).paths(nqn)
    assert sorted(p.state for p in paths) == ["live", "live"] and len({p.address for p in paths}) == 2, paths
    used = {kube.vm(FIRST).read(f"/sys/class/nvme/{p.controller}/hostnqn").strip() for p in paths}
    assert used == {BY_NAME[FIRST].host_nqn}, used
    report("drain to moved pod Running", f"{back:.1f}s (drain itself {drained:.1f}s; restart before {restarted:.1f}s)")
    report("events of the pod moved back", events_of(kube, "Pod", writer))
