"""The last scenarios of the Kubernetes tier (``MODULE_ORDER`` in conftest.py): every workload deleted leaves nothing on any
node, then ``helm uninstall`` leaves nothing of the release. Each runs alone too."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lab.kube.cluster import NAMESPACE, RELEASE, KubeCluster
from lab.kube.layout import GPUS
from tests.k8s.lifecycle import KEPT, delete_workloads, node_leftovers, release_leftovers
from tests.support.kube import NS, crictl, gone, wait_for

pytestmark = pytest.mark.lab


def test_everything_deleted_leaves_nothing(kube: KubeCluster) -> None:
    delete_workloads(kube)
    wait_for("no PersistentVolume", lambda: gone(kube, "pv"), 600)
    wait_for("no VolumeAttachment", lambda: gone(kube, "volumeattachments"), 600)
    wait_for("no VolumeSnapshotContent", lambda: gone(kube, "volumesnapshotcontents"), 300)
    assert not node_leftovers(kube)
    for node in GPUS:
        assert crictl(kube, node, "ps", "-q", "--label", f"io.kubernetes.pod.namespace={NS}").strip() == ""


def test_helm_uninstall_leaves_nothing(kube: KubeCluster, report: Callable[[str, str], None]) -> None:
    """After the claims are gone, ``helm uninstall`` leaves no object of the release, no CSINode entry, no
    driver container, and nothing of the driver's on the node."""
    delete_workloads(kube)
    wait_for("no PersistentVolume", lambda: gone(kube, "pv"), 600)
    assert release_leftovers(kube), "the release is not installed: nothing to uninstall"
    t0 = time.monotonic()
    print(kube.helm("uninstall", RELEASE, "--wait", "--timeout=300s", timeout=360))
    wait_for("nothing of the release left", lambda: not release_leftovers(kube) or None, 300, 3)
    report("helm uninstall", f"nothing of the release left {time.monotonic() - t0:.0f}s after it began")
    assert not node_leftovers(kube)
    kept = kube.kubectl("get", "configmaps", "-n", NAMESPACE, "-o", "name").split()
    assert set(KEPT) <= set(kept), kept  # the identity bindings outlive the release, as the chart says
    kube.kubectl("delete", "namespace", NAMESPACE, "--wait=true", timeout=300)  # the Secrets and leases
