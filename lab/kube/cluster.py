"""One lab Kubernetes cluster: the control plane on this host (:mod:`lab.kube.control_plane`), three lab VMs
as its nodes (``storage-1``, ``gpu-1``, ``gpu-2``: :mod:`lab.kube.layout`, :mod:`lab.kube.node`) on the lab
cluster's links (:mod:`lab.cluster`, whose faults apply), and our driver installed with Helm from
``deploy/helm/nvmeof-csi`` and its ``ci/lab-values.yaml`` exactly as docs/install.md tells an operator (snapshot
CRDs, the namespace, secrets, ``helm install``).

Contract: :func:`running_cluster` yields a :class:`KubeCluster` whose driver pods are Ready; on exit the VMs are
powered off and every control-plane process stopped. Steps print their durations. ``python -m
lab.kube.cluster`` brings one up for a person to look at (kubeconfig printed) until Ctrl-C.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from image.build import current as current_image
from image.machine_cache import machine_cache
from lab.build import REPO
from lab.cluster import LabCluster, qmp
from lab.guest_calls import LabError
from lab.kube import scratch_cache
from lab.kube.build import Go, versions
from lab.kube.control_plane import ControlPlane, KubeError
from lab.kube.images import build_images
from lab.kube.layout import BY_NAME, GPUS, MACHINES
from lab.kube.node import KubeNode, qemu_netdev
from lab.kube.pki import Pair, self_signed_ca, signed
from lab.vm import LabVM, VMExited

DRIVER = "csi.nvmeof.io"
NAMESPACE = "nvmeof-csi"
FABRIC = "lab"
SCRATCH_GB = 24


def say(msg: str) -> None:
    print(f"kube: {msg}", flush=True)


def timed(what: str, fn: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    out = fn()
    say(f"{what}: {time.monotonic() - t0:.1f}s")
    return out


CHART = REPO / "deploy" / "helm" / "nvmeof-csi"
LAB_VALUES = CHART / "ci" / "lab-values.yaml"
RELEASE = "nvmeof-csi"
#: the driver image's second name in the node's containerd: what an upgrade to a "new" tag installs
NEXT_TAG = "lab-next"


def helm_binary() -> Path:
    """helm, built by ``./dev`` into the machine cache; :class:`KubeError` when it is not there."""
    path = machine_cache() / "tools" / f"helm-{versions()['HELM_VERSION']}" / "helm"
    if not path.is_file():
        raise KubeError(f"{path} is not built: run ./dev setup")
    return path


def snapshot_crds() -> list[Path]:
    """The VolumeSnapshot CRDs from the pinned external-snapshotter client module."""
    snap = Go(Path(tempfile.gettempdir())).download(
        "github.com/kubernetes-csi/external-snapshotter/client/v8", versions()["EXTERNAL_SNAPSHOTTER_VERSION"]
    )
    return sorted((snap / "config" / "crd").glob("snapshot.storage.k8s.io_*.yaml"))


def tls_secret(name: str, pair: Pair, ca: Path) -> dict[str, Any]:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"tls.crt": b64(pair.crt), "tls.key": b64(pair.key), "ca.crt": b64(ca)},
    }


def ca_config_map(name: str, ca: Path) -> dict[str, Any]:
    """A ConfigMap holding one CA certificate as ``ca.crt`` (public: no key)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"ca.crt": ca.read_text()},
    }


class KubeCluster:
    """The running cluster: the control plane, the lab cluster of VMs (links and faults), a node per VM."""

    def __init__(self, cp: ControlPlane, lab: LabCluster, nodes: Mapping[str, KubeNode]) -> None:
        self.cp, self.lab, self.nodes = cp, lab, dict(nodes)
        #: host loopback port -> ``GUEST_IP:PORT`` the VMs reach it at (``running_cluster``'s ``forwards``)
        self.forwards: dict[str, int] = {}

    def vm(self, node: str) -> LabVM:
        """The VM of node ``node``."""
        return self.lab.vm(node)

    def node_of(self, pod: str, namespace: str) -> str:
        """The node ``pod`` is bound to (``AssertionError`` when it is not scheduled)."""
        name = self.cp.get("pod", "-n", namespace, pod)["spec"].get("nodeName")
        assert name, f"pod {namespace}/{pod} is not scheduled"
        return str(name)

    def ensure_alive(self, doing: str) -> None:
        for node in self.nodes:
            self.vm(node).ensure_alive(f"{node}: {doing}")

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120, check: bool = True) -> str:
        return self.cp.kubectl(*args, stdin=stdin, timeout=timeout, check=check)

    # -- faults: a node's way to the API server (its storage links stay), and a power cycle -------------------
    def cut_api(self, node: str) -> None:
        """``node`` loses its NIC to the API server (QMP ``set_link``: no carrier); undo: :meth:`restore_api`."""
        qmp(str(self.vm(node).qmp_socket), "set_link", name="kube", up=False)

    def restore_api(self, node: str) -> None:
        qmp(str(self.vm(node).qmp_socket), "set_link", name="kube", up=True)

    def restart_node(self, node: str) -> None:
        """Power-cycle ``node``'s VM (same disks, links re-addressed) and bring it back as a Ready node."""
        self.lab.power_cut(node)
        timed(f"{node} booted again", lambda: self.lab.boot(node))
        timed(f"{node} Ready again", self.nodes[node].start)

    def helm(self, *args: str, timeout: float = 300) -> str:
        """helm as the cluster admin, in the driver's namespace; stdout, or :class:`KubeError` with stderr."""
        argv = [str(helm_binary()), f"--kubeconfig={self.cp.admin_config}", "--namespace", NAMESPACE, *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if res.returncode:
            raise KubeError(f"helm {' '.join(args)}: {res.stderr.strip()[-2000:]}")
        return res.stdout

    def deploy(self, helm_args: Sequence[str] = ()) -> None:
        """Snapshot CRDs, the namespace, the agent's TLS secrets, then ``helm install`` with the lab's values (and
        ``helm_args``); waits for every driver pod Ready."""
        for crd in snapshot_crds():
            self.kubectl("apply", "--server-side", "-f", str(crd))
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
        self.kubectl("create", "namespace", NAMESPACE, check=False)
        self.kubectl("label", "--overwrite", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
        pki = self.cp.rundir / "driver-pki"
        pki.mkdir(exist_ok=True)
        ca = self.cp.pki.ca
        # identities issued in the cluster (docs/install.md): the node CA's key for the controller, its
        # certificate for agents and nodes (it issues the agents' server and the nodes' client certificates in
        # the cluster) and for the controller to check agents with; the lab CA signs the controller's own
        node_ca = self_signed_ca(pki, "node-ca", "/CN=nvmeof-csi node CA")
        client = signed(pki, ca, "controller", "/CN=controller.nvmeof-csi")
        self.cp.apply(tls_secret("nvmeof-csi-agent-client", client, node_ca.crt))
        self.cp.apply(tls_secret("nvmeof-csi-node-ca", node_ca, node_ca.crt))
        self.cp.apply(ca_config_map("nvmeof-csi-node-ca", node_ca.crt))
        self.cp.apply(ca_config_map("nvmeof-csi-client-ca", ca.crt))
        print(self.helm("install", RELEASE, str(CHART), "--values", str(LAB_VALUES), *helm_args), flush=True)
        self.wait_driver_ready()

    def wait_driver_ready(self, timeout: float = 900) -> None:
        """Every workload rolled out and the node plugin registered with kubelet; a VM that exits meanwhile
        is raised at once (:class:`VMExited`), not after ``timeout``."""
        deadline = time.monotonic() + timeout
        for kind, name in (
            ("daemonset", "nvmeof-csi-agent"),
            ("daemonset", "nvmeof-csi-node"),
            ("deployment", "nvmeof-csi-controller"),
            ("deployment", "snapshot-controller"),
        ):
            while True:
                self.ensure_alive(f"waiting for {kind}/{name} to roll out")
                left = deadline - time.monotonic()
                step = int(max(1, min(20, left)))
                try:
                    self.kubectl(
                        "-n", NAMESPACE, "rollout", "status", f"{kind}/{name}", f"--timeout={step}s", timeout=step + 30
                    )
                    break
                except KubeError:
                    if left <= step:
                        raise
        waiting = set(GPUS)
        while time.monotonic() < deadline:  # the node plugin registers with kubelet once it serves
            self.ensure_alive("waiting for the node plugins to register")
            for node in sorted(waiting):
                csinode = json.loads(self.kubectl("get", "csinode", node, "-o", "json", check=False) or "{}")
                if any(d.get("name") == DRIVER for d in csinode.get("spec", {}).get("drivers") or []):
                    waiting.discard(node)
            if not waiting:
                return
            time.sleep(2)
        raise KubeError(f"CSINode of {sorted(waiting)} never listed {DRIVER}\n{self.driver_logs()}")

    def pods(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cp.get("pods", "-n", namespace)["items"]
        return items

    def driver_logs(self) -> str:
        """Every node's container logs and kubelet/containerd tails (read in its guest), then the control
        plane's."""
        out = []
        for name, node in self.nodes.items():
            out.append(f"===== node {name}\n{node.logs(200)}")
            if node.vm.alive():
                res = node.vm.sh('for f in /var/log/pods/*/*/*.log; do echo "--- $f"; tail -n 80 "$f"; done', 60)
                out.append(res.out[-40000:])
        for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver"):
            out.append(f"--- {name}\n{self.cp.log_tail(name, 4000)}")
        return "\n".join(out)


def bring_up(
    cp: ControlPlane,
    lab: LabCluster,
    images: Mapping[str, Path],
    tag: str,
    disk_key: str,
    helm_args: Sequence[str],
    slim: Mapping[str, tuple[str, Path]],
) -> KubeCluster:
    """Boot every VM, make each a Ready node (``images`` imported, ``slim`` as :class:`KubeNode` takes it, ``tag``
    deployed as ``:lab``; the first GPU node's disk, when it had to import any, is saved under ``disk_key``),
    deploy the driver; the cluster with every driver pod Ready."""
    timed("lab VMs boot (" + ", ".join(m.name for m in MACHINES) + ")", lab.start)
    aliases = {"localhost/nvmeof-csi:lab": tag, f"localhost/nvmeof-csi:{NEXT_TAG}": tag}
    nodes = {
        m.name: KubeNode(lab.vm(m.name), cp, m, images, aliases=aliases, always=[tag], slim=slim) for m in MACHINES
    }
    saver = nodes[GPUS[0]]

    def save_disk(imported: list[str]) -> None:
        # a disk that held every image but the driver's (new with each change of the driver) is the saved one
        if any(ref != tag for ref in imported):
            timed("node disk saved for the next run", lambda: scratch_cache.save(saver.vm, disk_key))

    saver.on_imported = save_disk
    with ThreadPoolExecutor(len(nodes)) as pool:
        started = {name: pool.submit(timed, f"node {name} Ready", node.start) for name, node in nodes.items()}
        for name, future in started.items():
            future.result()
            say(f"{name}: " + ", ".join(f"{what} {seconds}s" for what, seconds in nodes[name].phases.items()))
    cluster = KubeCluster(cp, lab, nodes)
    timed("driver installed (helm install, ci/lab-values.yaml) and Ready", lambda: cluster.deploy(helm_args))
    return cluster


@contextmanager
def running_cluster(
    attempts: int = 2, forwards: Mapping[str, int] | None = None, helm_args: Sequence[str] = ()
) -> Iterator[KubeCluster]:
    """The cluster, up; ``forwards`` (``GUEST_IP:PORT`` -> host loopback port) are what the VMs reach of this
    host besides the API server (the Alluxio ports of ``layout``; what listens there may start later);
    ``helm_args`` go to ``helm install`` after the lab's values. A VM that
    exits while it is being brought up (before the caller has it) is replaced,
    with the whole lab, by a fresh one, up to ``attempts`` boots in all, each exit's console printed to stderr."""
    image = current_image()
    # the driver's base layer is one of the saved disk's images: a changed driver imports its own layer only
    images: Mapping[str, Path] = {
        **timed("local images", build_images),
        str(image["base_ref"]): Path(str(image["base_tar"])),
    }
    tag = f"localhost/nvmeof-csi:{image['tag']}"
    all_images = {**images, tag: Path(str(image["tar"]))}
    slim = {tag: (str(image["base_ref"]), Path(str(image["slim_tar"])))}  # where the base is, our blobs only
    rundir = Path(tempfile.mkdtemp(prefix="kube-lab-"))
    cp = ControlPlane(rundir, [m.name for m in MACHINES])
    lab: LabCluster | None = None
    try:
        timed("control plane (etcd, apiserver, controller-manager, scheduler)", cp.start)
        disk_key = scratch_cache.key(images, SCRATCH_GB)  # not the driver image: it changes with every commit
        if scratch_cache.cached(disk_key) is None:  # a fresh machine: one VM imports, every node copies its disk
            nic = qemu_netdev(cp.api_port, forwards)
            timed("node disk made", lambda: scratch_cache.seed(cp, BY_NAME[GPUS[0]], images, disk_key, SCRATCH_GB, nic))
        for attempt in range(1, attempts + 1):
            saved = scratch_cache.cached(disk_key)
            say(f"node disks: {f'copies of {saved}' if saved else f'blank (no saved disk {disk_key} yet)'}")
            specs = [m.spec for m in MACHINES]
            lab = LabCluster(
                specs, scratch_gb=SCRATCH_GB, scratch_from=saved, extra_nic=qemu_netdev(cp.api_port, forwards)
            )
            try:
                cluster = bring_up(cp, lab, all_images, tag, disk_key, helm_args, slim)
                cluster.forwards = dict(forwards or {})
                break
            except VMExited as gone:
                # a guest kernel died under TCG before any test ran: nothing of the tier's is lost by fresh VMs
                # (fresh scratch disks, the Node objects dropped so that the new kubelets register anew)
                lab.close()
                lab = None
                if attempt == attempts:
                    raise
                print(
                    f"kube: a lab VM exited during bring-up (attempt {attempt} of {attempts}); "
                    f"starting fresh ones. {gone}",
                    file=sys.stderr,
                    flush=True,
                )
                for m in MACHINES:
                    cp.kubectl("delete", "node", m.name, "--ignore-not-found", "--wait=false")
        yield cluster
    finally:
        if lab is not None:
            lab.close()
        cp.stop()
        say(f"control plane logs in {rundir}")


def main() -> int:
    with running_cluster() as cluster:
        say(f"up: KUBECONFIG={cluster.cp.admin_config}; Ctrl-C stops")
        ctl = cluster.cp.rundir / "guest.sock"
        # a person's window into the guest: `echo 'cmd' | socat - UNIX-CONNECT:<rundir>/guest.sock`
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(str(ctl))
        srv.listen(1)
        say(f"guest shell: echo 'NODE CMD' | socat - UNIX-CONNECT:{ctl}")
        try:
            while True:
                conn, _ = srv.accept()
                with conn:
                    node, _, cmd = conn.makefile().readline().strip().partition(" ")
                    try:
                        res = cluster.vm(node).sh(cmd, 600)
                        reply = json.dumps({"rc": res.rc}).encode() + b"\n" + res.out.encode() + res.err.encode()
                        conn.sendall(reply)
                    except (OSError, KeyError, LabError) as exc:  # a caller gone, a node misnamed: the next one
                        print(f"kube: guest shell: {exc!r}", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
