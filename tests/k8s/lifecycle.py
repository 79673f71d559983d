"""What the Kubernetes tier's install, upgrade and uninstall scenarios read: the driver's pods, a steady writer's
progress, and everything of the driver left on the nodes (nvmet subsystems, NVMe controllers, CSI mounts, staging
records, backing files) or in the API server once the release is gone."""

from __future__ import annotations

from lab.kube.cluster import DRIVER, NAMESPACE, KubeCluster
from lab.kube.control_plane import api_time
from lab.kube.layout import GPUS
from tests.support.kube import NS, container_exec, crictl, exited_log

PART_OF = "app.kubernetes.io/part-of=nvmeof-csi"
#: what helm uninstall keeps on purpose (helm.sh/resource-policy: keep): which Node each host NQN's identity was
#: issued to must outlive the release while a certificate of it may live; deleting the namespace removes it
KEPT = ("configmap/nvmeof-csi-identity-bindings",)
#: what the chart makes, by kind: namespaced in the release's namespace, then cluster-scoped
NAMESPACED = (
    "pods,deployments,daemonsets,replicasets,controllerrevisions,services,configmaps,serviceaccounts,roles,"
    "rolebindings,networkpolicies"
)
CLUSTER = "csidrivers,clusterroles,clusterrolebindings,storageclasses,volumeattributesclasses,volumesnapshotclasses"


def driver_pods(kube: KubeCluster) -> dict[str, dict[str, str]]:
    """Pod name -> {container name: image} of every pod of the release (terminating ones included)."""
    pods = kube.cp.get("pods", "-n", NAMESPACE, "-l", PART_OF)["items"]
    return {p["metadata"]["name"]: {c["name"]: c["image"] for c in p["spec"]["containers"]} for p in pods}


def roll_timeline(kube: KubeCluster) -> str:
    """Each pod of the release as ``name@node created+Cs scheduled+Ss ready+Rs [container+Ss rN ...]``, seconds
    after the first of them was created (the API server's clock), in order of creation, each container with its
    start and restart count (a restarted one with how its last run ended: ``(exit 1 Error at +Ts)``): where a
    rolling replacement spends its time."""

    pods = kube.cp.get("pods", "-n", NAMESPACE, "-l", PART_OF)["items"]
    first = min((api_time(p["metadata"]["creationTimestamp"]) for p in pods), default=0.0)

    def rel(stamp: str | None) -> str:
        return "?" if not stamp else f"+{api_time(stamp) - first:.0f}s"

    def ended(last: dict[str, object] | None) -> str:
        if not last:
            return ""
        return f" (exit {last.get('exitCode')} {last.get('reason', '')} at {rel(str(last.get('finishedAt') or ''))})"

    rows = []
    for p in sorted(pods, key=lambda p: str(p["metadata"]["creationTimestamp"])):
        cond = {c["type"]: c.get("lastTransitionTime") for c in p["status"].get("conditions", [])}
        containers = " ".join(
            f"{c['name']}{rel(c.get('state', {}).get('running', {}).get('startedAt'))} r{c.get('restartCount', 0)}"
            + ended(c.get("lastState", {}).get("terminated"))
            for c in p["status"].get("containerStatuses", [])
        )
        rows.append(
            f"{p['metadata']['name']}@{p['spec'].get('nodeName', '?')} created{rel(p['metadata']['creationTimestamp'])}"
            f" scheduled{rel(cond.get('PodScheduled'))} ready{rel(cond.get('Ready'))} [{containers}]"
        )
    return "; ".join(rows)


def restarted_logs(kube: KubeCluster, lines: int = 4) -> list[tuple[str, str]]:
    """For each restarted container of the release: (``pod/container``, the last ``lines`` lines its previous run
    logged)."""
    found = []
    for p in kube.cp.get("pods", "-n", NAMESPACE, "-l", PART_OF)["items"]:
        for c in p["status"].get("containerStatuses", []):
            if c.get("restartCount", 0):
                name = f"{p['metadata']['name']}/{c['name']}"
                # from containerd on its node: the lab's API server cannot reach kubelets for logs
                tail = exited_log(kube, p["spec"]["nodeName"], p["metadata"]["uid"], c["name"], lines)
                found.append((name, " | ".join(tail.strip().splitlines())[-600:] or "(an empty log)"))
    return found


def progress(kube: KubeCluster, pod: str) -> tuple[int, int]:
    """(writes done, writes failed) of a pod running ``workloads.STEADY`` (which renames its progress file into
    place: a read never sees it half written)."""
    i, e = container_exec(kube, pod, ["cat", "/data/progress"]).split()
    return int(i), int(e)


def delete_workloads(kube: KubeCluster) -> None:
    """Every Job, pod, snapshot and claim of the scenarios, waited for (idempotent)."""
    kube.kubectl("-n", NS, "delete", "jobs", "--all", "--wait=true", timeout=300)
    kube.kubectl("-n", NS, "delete", "pods", "--all", "--wait=true", timeout=300)
    kube.kubectl("-n", NS, "delete", "volumesnapshots", "--all", "--wait=true", timeout=300)
    kube.kubectl("-n", NS, "delete", "pvc", "--all", "--wait=true", timeout=600)


def node_leftovers(kube: KubeCluster) -> list[str]:
    """What of the driver's work is still on any node: one line per node and kind found (empty: nothing)."""
    found = []
    for node in kube.nodes:
        vm = kube.vm(node)
        subsystems = vm.run(["ls", "/sys/kernel/config/nvmet/subsystems"], 10).out.split()
        controllers = vm.run(["ls", "/sys/class/nvme"], 10).out.split()
        mounts = [
            ln
            for ln in vm.check(["cat", "/proc/mounts"], 10).splitlines()
            if "kubernetes.io~csi" in ln or "/plugins/kubernetes.io/csi" in ln
        ]
        records = vm.sh("ls /var/lib/nvmeof-csi/staging/ 2>/dev/null | grep '[.]json$'; true", 30).out.split()
        pool = vm.sh(
            "ls /srv/nvmeof-pool/volumes /srv/nvmeof-pool/snapshots 2>/dev/null | grep -v ':$'; true", 30
        ).out.split()
        for what, items in (
            ("nvmet subsystems", subsystems),
            ("NVMe controllers", controllers),
            ("CSI mounts", mounts),
            ("staging records", records),
            ("backing files", pool),
        ):
            if items:
                found.append(f"{node}: {what}: {items}")
    return found


def release_leftovers(kube: KubeCluster) -> list[str]:
    """What of the release is still in the API server or running on the node (empty: nothing): every object
    the chart labels, the CSIStorageCapacity objects the provisioner made, the node's CSINode entry of the
    driver, and the driver's containers."""
    found = []
    named = kube.kubectl("get", NAMESPACED, "-n", NAMESPACE, "-l", PART_OF, "-o", "name").split()
    named += kube.kubectl("get", CLUSTER, "-l", PART_OF, "-o", "name").split()
    named += kube.kubectl("get", "csistoragecapacities", "-n", NAMESPACE, "-o", "name").split()
    named = [n for n in named if n not in KEPT]
    if named:
        found.append(f"objects: {named}")
    for node in GPUS:
        drivers = kube.cp.get("csinode", node).get("spec", {}).get("drivers") or []
        if any(d.get("name") == DRIVER for d in drivers):
            found.append(f"CSINode {node} still lists {DRIVER}")
    for node in kube.nodes:
        label = f"io.kubernetes.pod.namespace={NAMESPACE}"
        if containers := crictl(kube, node, "ps", "-q", "--label", label).split():
            found.append(f"{node}: containers of namespace {NAMESPACE}: {containers}")
    return found
