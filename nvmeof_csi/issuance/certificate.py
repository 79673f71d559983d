"""A node's own identity: a GPU node's client certificate towards the agents, or a storage node's agent
server certificate; its key made here, its certificate issued by the controller's signer
(:mod:`nvmeof_csi.issuance.signer`) through a Kubernetes CertificateSigningRequest, and renewed before
it expires.

Files, in ``folder`` (on the node's disk): ``tls.key`` (0600, made once, never sent anywhere) and ``tls.crt``.
A request is made when there is no certificate, when it is not for this key or these names (CN, URIs, IP
addresses), or when two thirds of its lifetime have passed.

Contract: :meth:`IdentityCertificate.ensure` returns ``True`` when it wrote a new certificate, ``False`` when the
one there is good; it raises ``FailedPrecondition`` when the signer denied the request (with the signer's
reason) and ``Unavailable`` when the API cannot be asked or nothing was issued within ``wait`` seconds. A call
after a denial makes a new request (a node that asked before its kubelet registered its node ID is denied
once, and issued at its next try); a call after anything else finds its own pending request again.
Files are replaced with :func:`~nvmeof_csi.host.atomic.write_atomic`: a crash leaves the old file or the new one.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvmeof_csi.errors import FailedPrecondition, Unavailable
from nvmeof_csi.host.atomic import write_atomic
from nvmeof_csi.identity.certs import AGENT_PREFIX, NODE_PREFIX, certifies, expires, make_request, names_of, new_key
from nvmeof_csi.issuance.checks import AGENT_SIGNER

RENEW_AT = 2 / 3  # of the lifetime


class IdentityCertificate:
    def __init__(
        self,
        certificates: Any,
        folder: Path,
        signer: str,
        names: tuple[str, tuple[str, ...], tuple[str, ...]],
        lifetime: datetime.timedelta = datetime.timedelta(days=1),
        wait: float = 120.0,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``certificates``: ``kubernetes.client.CertificatesV1Api`` (or a stand-in); ``names``: (CN, URIs, IP
        addresses) to ask for (:func:`node_identity`, :func:`agent_identity`)."""
        self._api, self._folder, self._signer, self._names = certificates, folder, signer, names
        self._lifetime, self._wait, self._clock, self._sleep = lifetime, wait, clock, sleep
        self.cert, self.key = folder / "tls.crt", folder / "tls.key"
        self._denials = 0

    def _key(self) -> bytes:
        self._folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.key.exists():
            write_atomic(self.key, new_key(), 0o600)
        return self.key.read_bytes()

    def due(self) -> bool:
        """Whether a (new) certificate must be asked for."""
        key = self._key()
        try:
            cert = self.cert.read_bytes()
        except FileNotFoundError:
            return True
        try:
            if not certifies(cert, key) or names_of(cert) != self._names:
                return True
        except ValueError:
            return True
        start, end = expires(cert)
        return self._clock() >= start + (end - start) * RENEW_AT

    def ensure(self) -> bool:
        if not self.due():
            return False
        key = self._key()
        common, uris, ips = self._names
        pem = make_request(key, common, uris, ips)
        # one request per (key, names, certificate it replaces, denials so far): a retry finds its own again
        held = self.cert.read_bytes() if self.cert.exists() else b""
        basis = b"\0".join((key, repr(self._names).encode(), held, str(self._denials).encode()))
        kind = common.split(":", 1)[0]
        name = f"nvmeof-csi-{kind}-{common.split(':', 1)[-1][:180]}-{hashlib.sha256(basis).hexdigest()[:12]}"
        usage = "server auth" if self._signer == AGENT_SIGNER else "client auth"
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(pem).decode(),
                "signerName": self._signer,
                "usages": [usage, "digital signature"],
                "expirationSeconds": int(self._lifetime.total_seconds()),
            },
        }
        try:
            self._api.create_certificate_signing_request(body, _request_timeout=10)
        except Exception as exc:  # an existing request of this very key and names is the one to wait for
            if getattr(exc, "status", None) != 409:
                raise Unavailable(f"cannot ask for an identity ({name}): {_why(exc)}") from exc
        write_atomic(self.cert, self._issued(name), 0o644)
        return True

    def _issued(self, name: str) -> bytes:
        deadline = time.monotonic() + self._wait
        while True:
            try:
                csr = self._api.read_certificate_signing_request(name, _request_timeout=10)
            except Exception as exc:
                raise Unavailable(f"cannot read identity request {name}: {_why(exc)}") from exc
            status = csr.status
            for cond in (status.conditions if status else None) or []:
                if cond.type in ("Denied", "Failed") and cond.status == "True":
                    self._denials += 1
                    raise FailedPrecondition(f"identity request {name} {cond.type.lower()}: {cond.message}")
            if status and status.certificate:
                return base64.b64decode(status.certificate)
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"identity request {name}: not issued within {self._wait:.0f}s (is the controller up?)"
                )
            self._sleep(1.0)


def node_identity(node_name: str, host_nqn: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The names of a GPU node's identity (for :data:`NODE_SIGNER`)."""
    return NODE_PREFIX + node_name, (host_nqn,), ()


def agent_identity(agent: str, address: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The names of an agent's server identity (for :data:`AGENT_SIGNER`): its name and serving address."""
    return AGENT_PREFIX + agent, (), (address,)


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__} {getattr(exc, 'status', '')} {getattr(exc, 'reason', '')}".strip()[:200]
