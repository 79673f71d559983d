"""The lab cluster's PKI, made with the openssl CLI: one CA, the API server's serving certificate, a client
certificate per control-plane identity, each node's kubelet's, and the service-account signing key pair.

Contract: :func:`make_pki` writes everything under ``folder`` (mode 0600 keys) and returns the paths; the
identities are Kubernetes' own (``system:masters`` admin, ``system:kube-controller-manager``,
``system:kube-scheduler``, ``system:node:<node>`` in ``system:nodes``), so RBAC's bootstrap roles and the Node
authorizer apply unchanged. Certificates live one day: the lab is thrown away after a run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def openssl(*args: str) -> None:
    """Run the openssl CLI; ``RuntimeError`` with its stderr on failure."""
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"openssl {args[0]}: {proc.stderr[-1000:]}")


@dataclass(frozen=True)
class Pair:
    crt: Path
    key: Path


@dataclass(frozen=True)
class KubePki:
    ca: Pair
    apiserver: Pair
    admin: Pair
    controller_manager: Pair
    scheduler: Pair
    kubelets: dict[str, Pair]  # node name -> its kubelet's client certificate
    sa_key: Path
    sa_pub: Path


def signed(folder: Path, ca: Pair, name: str, subject: str, sans: Sequence[str] = (), server: bool = False) -> Pair:
    pair = Pair(folder / f"{name}.crt", folder / f"{name}.key")
    csr = folder / f"{name}.csr"
    ext = folder / f"{name}.ext"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(pair.key), "-out", str(csr))
    openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca.crt),
        "-CAkey",
        str(ca.key),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        str(ext),
        "-out",
        str(pair.crt),
    )
    pair.key.chmod(0o600)
    return pair


def self_signed_ca(folder: Path, name: str, subject: str) -> Pair:
    """A CA valid one day: ``<name>.crt`` and ``<name>.key`` (0600) in ``folder``."""
    ca = Pair(folder / f"{name}.crt", folder / f"{name}.key")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", subject,
            "-keyout", str(ca.key), "-out", str(ca.crt))  # fmt: skip
    ca.key.chmod(0o600)
    return ca


def make_pki(folder: Path, nodes: Sequence[str], api_ips: Sequence[str]) -> KubePki:
    """A fresh PKI for one lab cluster of ``nodes``; ``api_ips`` are the addresses the API server is reached at."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = self_signed_ca(folder, "ca", "/CN=nvmeof-csi-lab-ca")
    sans = [f"IP:{ip}" for ip in api_ips] + [
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
    sa_key, sa_pub = folder / "sa.key", folder / "sa.pub"
    openssl("genrsa", "-out", str(sa_key), "2048")
    openssl("rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    sa_key.chmod(0o600)
    return KubePki(
        ca=ca,
        apiserver=signed(folder, ca, "apiserver", "/CN=kube-apiserver", sans, server=True),
        admin=signed(folder, ca, "admin", "/O=system:masters/CN=nvmeof-csi-lab-admin"),
        controller_manager=signed(folder, ca, "controller-manager", "/CN=system:kube-controller-manager"),
        scheduler=signed(folder, ca, "scheduler", "/CN=system:kube-scheduler"),
        kubelets={n: signed(folder, ca, f"kubelet-{n}", f"/O=system:nodes/CN=system:node:{n}") for n in nodes},
        sa_key=sa_key,
        sa_pub=sa_pub,
    )


def kubeconfig(path: Path, server: str, ca: Path, client: Pair, user: str = "lab") -> Path:
    """A kubeconfig for ``client`` at ``server`` (files referenced by path, readable through the 9p share)."""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {{server: "{server}", certificate-authority: "{ca}"}}
users:
- name: {user}
  user: {{client-certificate: "{client.crt}", client-key: "{client.key}"}}
contexts:
- name: lab
  context: {{cluster: lab, user: {user}}}
current-context: lab
""")
    path.chmod(0o600)
    return path
