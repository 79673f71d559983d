"""The lab cluster's control plane on this host, on loopback only: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler, each a real binary built by :mod:`lab.kube.build`.

Why on the host: under TCG every instruction in the VM is emulated; the API server and etcd answer every
kubelet, sidecar and test call, so they run natively here and the VM (the node) reaches the API server through
one QEMU user-network forward (``guestfwd``) to a loopback port. The VM has no other route out.

Contract: :meth:`ControlPlane.start` returns once ``/readyz`` answers ok (or raises :class:`KubeError` with the
log tails); :meth:`ControlPlane.stop` leaves no process behind (they also die with this Python process).
:meth:`ControlPlane.kubectl` runs the real kubectl as the cluster admin. Every log is in ``rundir``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from lab.host import die_with_parent
from lab.kube.build import binary
from lab.kube.pki import KubePki, kubeconfig, make_pki

#: the API server as the VM sees it (QEMU guestfwd) and the service IP range: the ``kubernetes`` Service gets
#: the range's first address, 10.0.2.1, which the node relays to the API server (there is no kube-proxy)
GUEST_API = "10.0.2.100"
GUEST_API_PORT = 6443
SERVICE_RANGE = "10.0.2.0/28"
SERVICE_IP = "10.0.2.1"
#: gang scheduling (the Workload and PodGroup API, beta and off by default in 1.37) for the training Job scenario
FEATURE_GATES = "--feature-gates=GenericWorkload=true"


class KubeError(RuntimeError):
    """The cluster could not be started or a kubectl call failed."""


def api_time(stamp: str) -> float:
    """An API server timestamp (RFC 3339, ``2026-12-07T05:02:42Z``) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControlPlane:
    def __init__(self, rundir: Path, nodes: Sequence[str]) -> None:
        self.rundir = rundir
        self.nodes = tuple(nodes)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api_port = free_port()
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.pki: KubePki = make_pki(rundir / "pki", self.nodes, ["127.0.0.1", GUEST_API, SERVICE_IP])
        self.admin_config = kubeconfig(rundir / "admin.conf", self.server, self.pki.ca.crt, self.pki.admin)
        #: node name -> its kubelet's kubeconfig (the API server as the VMs reach it; its own identity)
        self.kubelet_configs = {
            node: kubeconfig(
                rundir / f"kubelet-{node}.conf",
                f"https://{GUEST_API}:{GUEST_API_PORT}",
                self.pki.ca.crt,
                pair,
                f"system:node:{node}",
            )
            for node, pair in self.pki.kubelets.items()
        }

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        with open(self.rundir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.rundir,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl
            )

    def log_tail(self, name: str, size: int = 3000) -> str:
        try:
            return (self.rundir / f"{name}.log").read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def _wait(self, what: str, ok: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise KubeError(f"{name} exited {proc.returncode} while waiting for {what}:\n{self.log_tail(name)}")
            if ok():
                return
            time.sleep(0.5)
        raise KubeError(
            f"{what}: not ready after {timeout:.0f}s\n" + "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self.procs)
        )

    def start(self) -> ControlPlane:
        p, d = self.pki, self.rundir
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                str(binary("etcd")),
                "--name",
                "lab",
                "--data-dir",
                str(d / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.etcd_peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.etcd_peer}",
                "--initial-cluster",
                f"lab=http://127.0.0.1:{self.etcd_peer}",
                "--log-level",
                "warn",
                "--unsafe-no-fsync",  # throw-away lab data: the host disk's fsync latency is not under test
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(binary("kube-apiserver")),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--advertise-address={GUEST_API}",
                f"--tls-cert-file={p.apiserver.crt}",
                f"--tls-private-key-file={p.apiserver.key}",
                f"--client-ca-file={p.ca.crt}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                FEATURE_GATES,
                "--runtime-config=scheduling.k8s.io/v1beta1=true",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver /readyz", self._ready, 180)
        cm_conf = kubeconfig(d / "controller-manager.conf", self.server, p.ca.crt, p.controller_manager)
        self._spawn(
            "kube-controller-manager",
            [
                str(binary("kube-controller-manager")),
                f"--kubeconfig={cm_conf}",
                f"--service-account-private-key-file={p.sa_key}",
                f"--root-ca-file={p.ca.crt}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={d / 'kcm-certs'}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--node-monitor-grace-period=20s",  # a node silent for 20 s is NotReady (kubelet posts every 5 s)
                FEATURE_GATES,
                "--v=1",
            ],
        )
        sched_conf = kubeconfig(d / "scheduler.conf", self.server, p.ca.crt, p.scheduler)
        self._spawn(
            "kube-scheduler",
            [
                str(binary("kube-scheduler")),
                f"--kubeconfig={sched_conf}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={d / 'sched-certs'}",
                FEATURE_GATES,
                "--v=1",
            ],
        )
        return self

    def _ready(self) -> bool:
        res = subprocess.run(
            [str(binary("kubectl")), f"--kubeconfig={self.admin_config}", "get", "--raw", "/readyz"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return res.returncode == 0 and res.stdout.strip() == "ok"

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120, check: bool = True) -> str:
        """kubectl as the cluster admin; stdout. :class:`KubeError` (with stderr) on failure when ``check``."""
        argv = [str(binary("kubectl")), f"--kubeconfig={self.admin_config}", *args]
        res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode:
            raise KubeError(f"kubectl {' '.join(args)}: {res.stderr.strip()[-2000:]}")
        return res.stdout

    def get(self, *args: str) -> Any:
        """``kubectl get ... -o json`` parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, manifest: str | Mapping[str, Any]) -> str:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl("apply", "-f", "-", stdin=text)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
