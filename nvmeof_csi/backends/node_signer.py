"""The controller's signer of node identities: Kubernetes CertificateSigningRequests for signerName
:data:`SIGNER` are checked and then approved and signed with the node CA, or denied with the reason.

A request is issued only when every fact holds (:func:`check`):

- it was made by the node plugin's service account (``system:serviceaccount:<namespace>:<account>``) with a
  pod-bound token, whose node claim (``authentication.kubernetes.io/node-name``, set by the API server) names
  the node the request is for: a node plugin can only ask for its own node;
- the PKCS#10 request is well formed (:func:`~nvmeof_csi.identity.certs.read_request`), its CN is
  ``node:<that node>`` and its one URI is a host NQN that this driver's entry in that node's CSINode — and no
  other node's — reports as its node ID (written by that node's kubelet at registration, the same fact
  ControllerPublishVolume trusts);
- usages are client auth (and digital signature / key encipherment) only.

Contract: :meth:`NodeSigner.pass_once` decides every pending request of :data:`SIGNER` (not yet approved,
denied or failed, no certificate), returning how many it issued, denied and left
undecided (the CSINodes could not be read); a request already decided is
never touched again; the API being unreachable raises nothing (logged, tried on the next pass). The node
CA key is read once at start and never logged. Several controller replicas may sign the same request: the
API keeps the first approval, a second is a conflict, logged and ignored.
"""

from __future__ import annotations

import base64
import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nvmeof_csi.errors import DriverError, InvalidArgument
from nvmeof_csi.identity.certs import NODE_PREFIX, Request, issue, read_request

log = logging.getLogger(__name__)

SIGNER = "csi.nvmeof.io/node-client"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
USAGES = frozenset({"client auth", "digital signature", "key encipherment"})
MIN_LIFETIME = datetime.timedelta(minutes=10)


class Refused(Exception):
    """Why a request is denied (its message is the Denied condition's message)."""


@dataclass(frozen=True)
class Policy:
    """Who may ask (the node plugin's service account user name) and for how long at most."""

    requester: str
    lifetime: datetime.timedelta


def check(spec: Any, policy: Policy, claimed_by: Callable[[str], list[str]]) -> tuple[Request, datetime.timedelta]:
    """The checked request and the lifetime to issue it for; ``Refused`` naming the first fact that fails."""
    if spec.username != policy.requester:
        raise Refused(f"requested by {spec.username!r}, not the node plugin ({policy.requester})")
    nodes = (spec.extra or {}).get(NODE_CLAIM) or []
    if len(nodes) != 1:
        raise Refused("the requester's token names no node (a pod-bound service account token is needed)")
    usages = set(spec.usages or [])
    if "client auth" not in usages or usages - USAGES:
        raise Refused(f"usages {sorted(usages)}: a node identity is for client auth only")
    try:
        request = read_request(base64.b64decode(spec.request))
    except (InvalidArgument, ValueError) as exc:
        raise Refused(f"malformed request: {exc}") from exc
    node = nodes[0]
    if request.common_name != NODE_PREFIX + node:
        raise Refused(f"asks for {request.common_name!r} but its requester runs on node {node!r}")
    if len(request.uris) != 1:
        raise Refused("a node identity names exactly one host NQN (one URI)")
    claimants = claimed_by(request.uris[0])
    if claimants != [node]:
        raise Refused(f"host NQN {request.uris[0][:230]!r} is the node ID of {claimants or 'no node'}, not {node!r}")
    lifetime = policy.lifetime
    if spec.expiration_seconds:
        lifetime = min(lifetime, max(MIN_LIFETIME, datetime.timedelta(seconds=int(spec.expiration_seconds))))
    return request, lifetime


def _decided(csr: Any) -> bool:
    conditions = (csr.status.conditions if csr.status else None) or []
    return bool(csr.status and csr.status.certificate) or any(
        c.type in ("Approved", "Denied", "Failed") and c.status == "True" for c in conditions
    )


def _condition(kind: str, reason: str, message: str, now: datetime.datetime) -> dict[str, Any]:
    return {
        "type": kind, "status": "True", "reason": reason, "message": message[:1000],
        "lastUpdateTime": now.isoformat(), "lastTransitionTime": now.isoformat(),
    }  # fmt: skip


class NodeSigner:
    def __init__(
        self,
        certificates: Any,
        claimed_by: Callable[[str], list[str]],
        ca: tuple[bytes, bytes],
        policy: Policy,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        """``certificates``: ``kubernetes.client.CertificatesV1Api`` (or a stand-in); ``ca``: the node CA's
        certificate and key (PEM); ``claimed_by``: the Nodes whose CSINode reports a node ID."""
        self._api, self._claimed_by, self._ca, self._policy, self._clock = certificates, claimed_by, ca, policy, clock
        self._stop = threading.Event()

    def pass_once(self) -> Mapping[str, int]:
        counts = {"issued": 0, "denied": 0, "left": 0}
        try:
            pending = self._api.list_certificate_signing_request(
                field_selector=f"spec.signerName={SIGNER}", _request_timeout=10
            ).items
        except Exception as exc:  # the client's errors are many types: each means "cannot ask now"
            log.warning("node identities: cannot list certificate signing requests: %s", type(exc).__name__)
            return counts
        for csr in pending:
            if csr.spec.signer_name == SIGNER and not _decided(csr):
                counts[self._decide(csr)] += 1
        return counts

    def _decide(self, csr: Any) -> str:
        name, now = csr.metadata.name, self._clock()
        try:
            request, lifetime = check(csr.spec, self._policy, self._claimed_by)
        except Refused as why:
            log.warning("node identity request %s denied: %s", name, why)
            self._patch_approval(name, _condition("Denied", "NodeIdentityRefused", str(why), now))
            return "denied"
        except DriverError as exc:  # the CSINodes could not be read: undecided, tried again next pass
            log.warning("node identity request %s left for the next pass: %s", name, exc)
            return "left"
        cert = issue(request, *self._ca, lifetime, now)
        message = f"{request.common_name} with host NQN {request.uris[0]}, for {lifetime}"
        self._patch_approval(name, _condition("Approved", "NodeIdentityChecked", message, now))
        self._patch(
            self._api.patch_certificate_signing_request_status,
            name,
            {"status": {"certificate": base64.b64encode(cert).decode()}},
        )
        log.info("node identity issued: %s (%s)", name, message)
        return "issued"

    def _patch_approval(self, name: str, condition: dict[str, Any]) -> None:
        self._patch(self._api.patch_certificate_signing_request_approval, name, {"status": {"conditions": [condition]}})

    @staticmethod
    def _patch(method: Callable[..., Any], name: str, body: dict[str, Any]) -> None:
        try:
            method(name, body, _content_type="application/merge-patch+json", _request_timeout=10)
        except Exception as exc:
            log.warning("node identity request %s: the API refused an update: %s", name, _status(exc))

    def start(self, every: float = 3.0) -> None:
        """Decide pending requests every ``every`` seconds in a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(every):
                self.pass_once()

        threading.Thread(target=loop, name="node-signer", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def _status(exc: Exception) -> str:
    return f"{type(exc).__name__} {getattr(exc, 'status', '')} {getattr(exc, 'reason', '')}".strip()
