"""A tenant's pod on a GPU node, against the other tenants' volumes on that node (security round 3, point 1):
an unprivileged pod on the node of a DH-HMAC-CHAP volume cannot read the node's NVMe secret attributes in sysfs
(the node plugin narrows them to root after each connect) and cannot open a TCP connection to a storage portal
(the chart's egress guard, ``node.egressGuard`` in ``ci/lab-values.yaml``), while the volume keeps working.

Before: the attributes were world-readable and the pod's connection to the portal was forwarded by its node
(``tests/component/test_egress_guard_netns.py`` shows the unguarded connect succeeding on a real kernel).

The same volume is NVMe/TCP TLS across machines (class ``lab-auth``: ``tls: psk``; tlshd beside the agent and the
node plugin, the chart's ``nvmeTls.handshakeDaemon``): a marker the pod writes never crosses the storage node's
fabric links in clear text. ``LAB_TLS=none`` stages it on a clear-text copy of the class instead, and the
marker is then seen on the wire (the proof fails)."""

from __future__ import annotations

import json
import os
import secrets as token
from typing import Any

import pytest

from lab.cluster import SUBNETS
from lab.kube.cluster import KubeCluster
from lab.kube.layout import BY_NAME, STORAGE
from tests.support.capture import captured, copies
from tests.support.kube import NS, container_exec, crictl, file_in, phase, pod, pvc, wait_for

pytestmark = pytest.mark.lab

DRIVER_IMAGE = "localhost/nvmeof-csi:lab"  # has python3; the tenant runs with no privilege at all
PORTAL = f"169.254.{SUBNETS['fa']}.{BY_NAME[STORAGE].spec.index}"
#: run as the tenant: every secret attribute of every NVMe controller, then a portal and a closed port beside it
PROBE = """
import glob, json, socket
secrets = {}
for path in sorted(glob.glob("/sys/class/nvme/nvme*/dhchap_*secret")):
    try:
        with open(path) as f:
            secrets[path] = "READ " + f.read(8)
    except OSError as exc:
        secrets[path] = type(exc).__name__
def connect(port):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((PORTAL, port))
        return "connected"
    except OSError as exc:
        return exc.errno or type(exc).__name__
outcomes = sorted(set(secrets.values()))
print(json.dumps({"secrets": len(secrets), "outcomes": outcomes, "portal": connect(4420), "closed": connect(4499)}))
"""


def tenant(node: str) -> dict[str, Any]:
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                  "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    script = f"PORTAL = {PORTAL!r}\n{PROBE}"
    container = {"name": "tenant", "image": DRIVER_IMAGE, "imagePullPolicy": "Never", "securityContext": restricted,
                 "command": ["/opt/nvmeof-csi/bin/python", "-c", script]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tenant", "namespace": NS},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]}}  # fmt: skip


def storage_class(kube: KubeCluster) -> str:
    """``lab-auth`` (TLS); under ``LAB_TLS=none`` a clear-text copy of it, made here, to show the proof failing."""
    if os.environ.get("LAB_TLS", "") != "none":
        return "lab-auth"
    clear = kube.cp.get("storageclass", "lab-auth")
    clear["parameters"].pop("tls", None)
    clear["metadata"] = {"name": "lab-auth-clear"}
    kube.cp.apply(clear)
    return "lab-auth-clear"


def marker_on_the_wire(kube: KubeCluster) -> str:
    """Write 4 MiB of a marker through the volume (synced) while the storage node captures its portals' ports on
    every interface; assert that over 1 MiB crossed and that the marker is nowhere in it."""
    marker = f"tls-marker-{token.token_hex(8)}"
    storage = kube.vm(STORAGE)
    write = f"yes {marker} | head -c 4194304 > /data/marker && sync && echo done"
    with captured(storage, (4420, 4421, 4430, 4431), interface="any") as pcap:
        assert container_exec(kube, "keyed-io", ["sh", "-c", write], timeout=300).strip() == "done"
    size, seen = copies(storage, pcap, marker)
    assert size > 1 << 20, f"only {size} bytes crossed the portals: the write did not go over the fabric"
    assert seen == 0, f"the marker crossed the fabric in clear text ({seen} capture lines hold it, {size} bytes)"
    return f"{size} bytes on the portals of {STORAGE}, marker in clear text 0 times"


def test_a_tenant_pod_cannot_read_the_node_keys_nor_reach_a_portal(kube: KubeCluster) -> None:
    kube.cp.apply({"apiVersion": "v1", "kind": "List", "items": [
        pvc("keyed", storage_class(kube)), pod("keyed-io", "keyed", "echo kept > /data/hello; sync; sleep 100000"),
    ]})  # fmt: skip
    try:
        wait_for("keyed-io running", lambda: phase(kube, "pod", "keyed-io") == "Running", 600)
        wait_for("keyed-io wrote", lambda: file_in(kube, "keyed-io", "/data/hello").strip() == "kept", 120)
        wire = marker_on_the_wire(kube)
        node = kube.node_of("keyed-io", NS)
        kube.cp.apply(tenant(node))
        wait_for("the tenant pod ran", lambda: phase(kube, "pod", "tenant") in ("Succeeded", "Failed"), 300)
        # the lab's API server cannot reach a kubelet (kubectl logs cannot): the container's log, on its node
        ids = crictl(kube, node, "ps", "-a", "-q", "--label", "io.kubernetes.pod.name=tenant",
                     "--label", f"io.kubernetes.pod.namespace={NS}").split()  # fmt: skip
        assert len(ids) == 1, ids
        seen = json.loads(crictl(kube, node, "logs", ids[0]).strip().splitlines()[-1])
        assert seen["secrets"] > 0, f"no NVMe secret attribute on {node}: the volume's controller is not there"
        assert seen["outcomes"] == ["PermissionError"], seen
        assert seen["portal"] == 113, seen  # EHOSTUNREACH: refused by the node's guard, at once
        assert seen["closed"] == 111, seen  # ECONNREFUSED by the storage node: the pod's path is there
        container_exec(kube, "keyed-io", ["sh", "-c", "echo still > /data/after && sync"])
        assert file_in(kube, "keyed-io", "/data/hello").strip() == "kept"  # the node's volume kept working
        print(
            f"tenant on {node}: {seen['secrets']} secret attributes refused, portal {PORTAL}:4420 "
            f"refused (errno {seen['portal']}), closed port answered by the storage node (errno {seen['closed']}); "
            f"TLS: {wire}"
        )
    finally:
        kube.kubectl("-n", NS, "delete", "pod", "tenant", "keyed-io", "--wait=true", "--timeout=300s", check=False)
        kube.kubectl("-n", NS, "delete", "pvc", "keyed", "--wait=true", "--timeout=300s", check=False)
        kube.kubectl("delete", "storageclass", "lab-auth-clear", "--ignore-not-found", check=False)
