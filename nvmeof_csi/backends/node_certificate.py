"""A GPU node's own client identity towards the agents: its key made here, its certificate issued by the
controller's signer (:mod:`nvmeof_csi.backends.node_signer`) through a Kubernetes CertificateSigningRequest,
and renewed before it expires.

Files, in ``folder`` (on the node's disk, beside its host NQN): ``tls.key`` (0600, made once, never sent
anywhere) and ``tls.crt``. A request is made when there is no certificate, when it is not for this key, node
or host NQN, or when two thirds of its lifetime have passed.

Contract: :meth:`NodeCertificate.ensure` returns ``True`` when it wrote a new certificate, ``False`` when the
one there is good; it raises ``FailedPrecondition`` when the signer denied the request (with the signer's
reason) and ``Unavailable`` when the API cannot be asked or nothing was issued within ``wait`` seconds.
Files are replaced atomically (write, fsync, rename): a crash leaves the old pair or the new one.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvmeof_csi.backends.node_signer import SIGNER
from nvmeof_csi.errors import FailedPrecondition, Unavailable
from nvmeof_csi.identity.certs import certifies, expires, new_key, node_identity_of, node_request

RENEW_AT = 2 / 3  # of the lifetime


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class NodeCertificate:
    def __init__(
        self,
        certificates: Any,
        folder: Path,
        node_name: str,
        host_nqn: str,
        lifetime: datetime.timedelta = datetime.timedelta(days=1),
        wait: float = 120.0,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``certificates``: ``kubernetes.client.CertificatesV1Api`` (or a stand-in)."""
        self._api, self._folder, self._node, self._nqn = certificates, folder, node_name, host_nqn
        self._lifetime, self._wait, self._clock, self._sleep = lifetime, wait, clock, sleep
        self.cert, self.key = folder / "tls.crt", folder / "tls.key"

    def _key(self) -> bytes:
        self._folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.key.exists():
            _write(self.key, new_key(), 0o600)
        return self.key.read_bytes()

    def due(self) -> bool:
        """Whether a (new) certificate must be asked for."""
        key = self._key()
        try:
            cert = self.cert.read_bytes()
        except FileNotFoundError:
            return True
        if not certifies(cert, key) or node_identity_of(cert) != (self._node, self._nqn):
            return True
        start, end = expires(cert)
        return self._clock() >= start + (end - start) * RENEW_AT

    def ensure(self) -> bool:
        if not self.due():
            return False
        key = self._key()
        pem = node_request(key, self._node, self._nqn)
        # one request per (key, node, NQN, certificate it replaces): a retry finds its own request again
        held = self.cert.read_bytes() if self.cert.exists() else b""
        basis = b"\0".join((key, self._node.encode(), self._nqn.encode(), held))
        name = f"nvmeof-csi-{self._node[:200]}-{hashlib.sha256(basis).hexdigest()[:12]}"
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(pem).decode(),
                "signerName": SIGNER,
                "usages": ["client auth", "digital signature"],
                "expirationSeconds": int(self._lifetime.total_seconds()),
            },
        }
        try:
            self._api.create_certificate_signing_request(body, _request_timeout=10)
        except Exception as exc:  # an existing request of this very key and names is the one to wait for
            if getattr(exc, "status", None) != 409:
                raise Unavailable(f"cannot ask for a node identity ({name}): {_why(exc)}") from exc
        _write(self.cert, self._issued(name), 0o644)
        return True

    def _issued(self, name: str) -> bytes:
        deadline = time.monotonic() + self._wait
        while True:
            try:
                csr = self._api.read_certificate_signing_request(name, _request_timeout=10)
            except Exception as exc:
                raise Unavailable(f"cannot read node identity request {name}: {_why(exc)}") from exc
            status = csr.status
            for cond in (status.conditions if status else None) or []:
                if cond.type in ("Denied", "Failed") and cond.status == "True":
                    raise FailedPrecondition(f"node identity request {name} {cond.type.lower()}: {cond.message}")
            if status and status.certificate:
                return base64.b64decode(status.certificate)
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"node identity request {name}: not issued within {self._wait:.0f}s (is the controller up?)"
                )
            self._sleep(1.0)


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__} {getattr(exc, 'status', '')} {getattr(exc, 'reason', '')}".strip()[:200]
