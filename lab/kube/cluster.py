"""One lab Kubernetes cluster: the control plane on this host (:mod:`lab.kube.control_plane`), the lab VM as
its only node (:mod:`lab.kube.node`), and our driver installed with Helm from ``deploy/helm/nvmeof-csi`` and
its ``ci/lab-values.yaml`` exactly as docs/install.md tells an operator (snapshot CRDs, the namespace, secrets,
``helm install``).

Contract: :func:`running_cluster` yields a :class:`KubeCluster` whose driver pods are Ready; on exit the VM is
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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from image.build import current as current_image
from lab.build import REPO
from lab.kube import scratch_cache
from lab.kube.build import Go, versions
from lab.kube.control_plane import ControlPlane, KubeError
from lab.kube.images import build_images
from lab.kube.node import KubeNode, qemu_netdev
from lab.kube.pki import Pair, self_signed_ca, signed
from lab.machine_cache import machine_cache
from lab.vm import LabVM, VMExited

DRIVER = "csi.nvmeof.io"
NAMESPACE = "nvmeof-csi"
NODE = "lab"
FABRIC = "lab"
SCRATCH_GB = 24
NODE_LABELS = {"csi.nvmeof.io/gpu-node": "true", "csi.nvmeof.io/storage-node": "true"}


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
    def __init__(self, cp: ControlPlane, vm: LabVM, node: KubeNode) -> None:
        self.cp, self.vm, self.node = cp, vm, node

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120, check: bool = True) -> str:
        return self.cp.kubectl(*args, stdin=stdin, timeout=timeout, check=check)

    def helm(self, *args: str, timeout: float = 300) -> str:
        """helm as the cluster admin, in the driver's namespace; stdout, or :class:`KubeError` with stderr."""
        argv = [str(helm_binary()), f"--kubeconfig={self.cp.admin_config}", "--namespace", NAMESPACE, *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if res.returncode:
            raise KubeError(f"helm {' '.join(args)}: {res.stderr.strip()[-2000:]}")
        return res.stdout

    def deploy(self) -> None:
        """Snapshot CRDs, the namespace, the agent's TLS secrets, then ``helm install`` with the lab's values;
        waits for every driver pod Ready."""
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
        print(self.helm("install", RELEASE, str(CHART), "--values", str(LAB_VALUES)), flush=True)
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
                self.vm.ensure_alive(f"waiting for {kind}/{name} to roll out")
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
        while time.monotonic() < deadline:  # the node plugin registers with kubelet once it serves
            self.vm.ensure_alive("waiting for the node plugin to register")
            drivers = self.cp.get("csinode", NODE).get("spec", {}).get("drivers") or []
            if any(d.get("name") == DRIVER for d in drivers):
                return
            time.sleep(2)
        raise KubeError(f"CSINode {NODE} never listed {DRIVER}\n{self.driver_logs()}")

    def pods(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cp.get("pods", "-n", namespace)["items"]
        return items

    def driver_logs(self) -> str:
        """Every container log of the driver's pods and the kubelet/containerd tails (read in the guest)."""
        out = [self.node.logs(200)]
        res = self.vm.sh('for f in /var/log/pods/*/*/*.log; do echo "--- $f"; tail -n 80 "$f"; done', 60)
        out.append(res.out[-60000:])
        for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver"):
            out.append(f"--- {name}\n{self.cp.log_tail(name, 4000)}")
        return "\n".join(out)


def bring_up(cp: ControlPlane, vm: LabVM, images: Mapping[str, Path], tag: str, disk_key: str) -> KubeCluster:
    """Boot ``vm``, make it the Ready node (``images`` imported, ``tag`` deployed as ``:lab``; a disk that had
    to import any is saved under ``disk_key``), deploy the driver; the cluster with every driver pod Ready."""
    timed("lab VM boot", vm.start)
    aliases = {"localhost/nvmeof-csi:lab": tag, f"localhost/nvmeof-csi:{NEXT_TAG}": tag}
    node = KubeNode(vm, cp, images, NODE_LABELS, aliases=aliases, always=[tag])

    def save_disk(imported: list[str]) -> None:
        # a disk that held every image but the driver's (new with each change of the driver) is the saved one
        if any(ref != tag for ref in imported):
            timed("node disk saved for the next run", lambda: scratch_cache.save(vm, disk_key))

    node.on_imported = save_disk
    timed("node Ready (containerd, images, kubelet)", node.start)
    say("node: " + ", ".join(f"{what} {seconds}s" for what, seconds in node.phases.items()))
    cluster = KubeCluster(cp, vm, node)
    timed("driver installed (helm install, ci/lab-values.yaml) and Ready", cluster.deploy)
    return cluster


@contextmanager
def running_cluster(mem_mb: int = 6144, attempts: int = 2) -> Iterator[KubeCluster]:
    """The cluster, up; a lab VM that exits while it is being brought up (before the caller has it) is
    replaced by a fresh one, up to ``attempts`` boots in all, each exit's console printed to stderr."""
    image = current_image()
    # the driver's base layer is one of the saved disk's images: a changed driver imports its own layer only
    images: Mapping[str, Path] = {
        **timed("local images", build_images),
        str(image["base_ref"]): Path(str(image["base_tar"])),
    }
    tag = f"localhost/nvmeof-csi:{image['tag']}"
    all_images = {**images, tag: Path(str(image["tar"]))}
    rundir = Path(tempfile.mkdtemp(prefix="kube-lab-"))
    cp = ControlPlane(rundir, NODE)
    vm: LabVM | None = None
    try:
        timed("control plane (etcd, apiserver, controller-manager, scheduler)", cp.start)
        disk_key = scratch_cache.key(images, SCRATCH_GB)  # not the driver image: it changes with every commit
        for attempt in range(1, attempts + 1):
            saved = scratch_cache.cached(disk_key)
            vm = timed(
                f"node disk: {f'a copy of {saved}' if saved else f'blank (no saved disk {disk_key} yet)'}",
                partial(
                    LabVM,
                    mem_mb=mem_mb,
                    cpus=2,
                    scratch_gb=SCRATCH_GB,
                    nic=qemu_netdev(cp.api_port),
                    scratch_from=saved,
                ),
            )
            try:
                cluster = bring_up(cp, vm, all_images, tag, disk_key)
                break
            except VMExited as gone:
                # the guest kernel died under TCG before any test ran: nothing of the tier's is lost by a
                # fresh VM (a fresh scratch disk, the Node object dropped so the new kubelet registers anew)
                vm.close()
                vm = None
                if attempt == attempts:
                    raise
                print(
                    f"kube: the lab VM exited during bring-up (attempt {attempt} of {attempts}); "
                    f"starting a fresh one. {gone}",
                    file=sys.stderr,
                    flush=True,
                )
                cp.kubectl("delete", "node", NODE, "--ignore-not-found", "--wait=false")
        yield cluster
    finally:
        if vm is not None:
            vm.close()
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
        say(f"guest shell: echo CMD | socat - UNIX-CONNECT:{ctl}")
        try:
            while True:
                conn, _ = srv.accept()
                with conn:
                    cmd = conn.makefile().readline().strip()
                    res = cluster.vm.sh(cmd, 600)
                    conn.sendall(json.dumps({"rc": res.rc}).encode() + b"\n" + res.out.encode() + res.err.encode())
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
