"""The controller's signer of identities: Kubernetes CertificateSigningRequests for this driver's signerNames
(node client identities, agent server identities) are checked (:mod:`nvmeof_csi.issuance.checks`) and
then approved and signed with the node CA, or denied with the reason.

Contract: :meth:`IdentitySigner.pass_once` decides every pending request of each signerName it has a check for
(not yet approved, denied or failed, no certificate), returning how many it issued, denied and left undecided
(the facts could not be read: tried on the next pass); a request already decided is never touched again; the
API being unreachable raises nothing (logged, tried on the next pass). It approves and signs for its own
signerNames only. The CA key is read once at start and never logged. Several controller replicas may sign the
same request: the API keeps the first approval, a second is a conflict, logged and ignored.
"""

from __future__ import annotations

import base64
import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from nvmeof_csi.errors import DriverError
from nvmeof_csi.identity.certs import Request, issue
from nvmeof_csi.issuance.checks import AGENT_SIGNER, Refused

log = logging.getLogger(__name__)

#: a signerName's check: the request's spec -> (checked request, lifetime), or ``Refused``
Check = Callable[[Any], tuple[Request, datetime.timedelta]]


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


class IdentitySigner:
    def __init__(
        self,
        certificates: Any,
        checks: Mapping[str, Check],
        ca: tuple[bytes, bytes],
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        """``certificates``: ``kubernetes.client.CertificatesV1Api`` (or a stand-in); ``checks``: signerName ->
        its check; ``ca``: the node CA's certificate and key (PEM)."""
        self._api, self._checks, self._ca, self._clock = certificates, dict(checks), ca, clock

    def pass_once(self) -> Mapping[str, int]:
        counts = {"issued": 0, "denied": 0, "left": 0}
        for signer, check in self._checks.items():
            try:
                pending = self._api.list_certificate_signing_request(
                    field_selector=f"spec.signerName={signer}", _request_timeout=10
                ).items
            except Exception as exc:  # the client's errors are many types: each means "cannot ask now"
                log.warning("identities: cannot list certificate signing requests: %s", type(exc).__name__)
                continue
            for csr in pending:
                if csr.spec.signer_name == signer and not _decided(csr):
                    counts[self._decide(csr, check, server=signer == AGENT_SIGNER)] += 1
        return counts

    def _decide(self, csr: Any, check: Check, server: bool) -> str:
        name, now = csr.metadata.name, self._clock()
        try:
            request, lifetime = check(csr.spec)
        except Refused as why:
            log.warning("identity request %s denied: %s", name, why)
            self._patch_approval(name, _condition("Denied", "IdentityRefused", str(why), now))
            return "denied"
        except DriverError as exc:  # the facts could not be read: undecided, tried again next pass
            log.warning("identity request %s left for the next pass: %s", name, exc)
            return "left"
        cert = issue(request, *self._ca, lifetime, now, server=server)
        names = ", ".join((*request.uris, *request.ips))
        message = f"{request.common_name} ({names}), for {lifetime}"
        self._patch_approval(name, _condition("Approved", "IdentityChecked", message, now))
        self._patch(
            self._api.patch_certificate_signing_request_status,
            name,
            {"status": {"certificate": base64.b64encode(cert).decode()}},
        )
        log.info("identity issued: %s (%s)", name, message)
        return "issued"

    def _patch_approval(self, name: str, condition: dict[str, Any]) -> None:
        self._patch(self._api.patch_certificate_signing_request_approval, name, {"status": {"conditions": [condition]}})

    @staticmethod
    def _patch(method: Callable[..., Any], name: str, body: dict[str, Any]) -> None:
        try:
            method(name, body, _content_type="application/merge-patch+json", _request_timeout=10)
        except Exception as exc:
            log.warning("node identity request %s: the API refused an update: %s", name, _status(exc))

    def run(self, stop: threading.Event, every: float = 3.0) -> None:
        """Decide pending requests every ``every`` seconds until ``stop`` is set (a background loop)."""
        while not stop.wait(every):
            self.pass_once()


def _status(exc: Exception) -> str:
    return f"{type(exc).__name__} {getattr(exc, 'status', '')} {getattr(exc, 'reason', '')}".strip()
