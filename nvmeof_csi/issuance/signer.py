"""The controller's signer of identities: Kubernetes CertificateSigningRequests for this driver's signerNames
(node client identities, agent server identities) are checked (:mod:`nvmeof_csi.issuance.checks`) and
then approved and signed with the node CA, or denied with the reason.

Contract: :meth:`IdentitySigner.pass_once` decides every pending request of each signerName it has a check for
(not yet approved, denied or failed, no certificate), returning how many it issued, denied and left undecided
(the facts could not be read: tried on the next pass); a request already decided is never touched again; the
API being unreachable raises nothing (logged, tried on the next pass). It approves and signs for its own
signerNames only. The CA key is read once at start and never logged. Several controller replicas may sign the
same request: the API keeps the first approval, a second is a conflict, logged and ignored.

One request never stops the signer: whatever its check or its signing raises (a malformed request's parser
errors included) denies that request with the reason, and :meth:`IdentitySigner.run` survives a failed pass.
A requester (service account user and node) with more than :data:`MAX_PENDING` undecided requests at once has
the surplus denied. With ``leader`` (``kube/lease.py``), only the replica that leads runs passes; the others
stand by (a standby loop counts as alive). :meth:`IdentitySigner.health` is not ready when no pass ended for
``stale_after`` seconds (the controller's readiness); :meth:`IdentitySigner.collect` exports the passes, the
decisions and whether this replica leads to Prometheus.
"""

from __future__ import annotations

import base64
import datetime
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from nvmeof_csi.errors import DriverError
from nvmeof_csi.identity.certs import Request, issue
from nvmeof_csi.issuance.checks import AGENT_SIGNER, NODE_CLAIM, Refused
from nvmeof_csi.service.contracts import Health

log = logging.getLogger(__name__)

#: a signerName's check: the request's spec -> (checked request, lifetime), or ``Refused``
Check = Callable[[Any], tuple[Request, datetime.timedelta]]
MAX_PENDING = 4  # undecided requests one requester may have at once; the surplus is denied


def _requester(csr: Any) -> str:
    nodes = (csr.spec.extra or {}).get(NODE_CLAIM) or ["?"]
    return f"{csr.spec.username} on {','.join(map(str, nodes))}"[:200]


def _created(csr: Any) -> tuple[str, str]:
    return str(getattr(csr.metadata, "creation_timestamp", "") or ""), str(csr.metadata.name)


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
        monotonic: Callable[[], float] = time.monotonic,
        stale_after: float = 60.0,
        leader: Callable[[], bool] | None = None,
    ) -> None:
        """``certificates``: ``kubernetes.client.CertificatesV1Api`` (or a stand-in); ``checks``: signerName ->
        its check; ``ca``: the node CA's certificate and key (PEM)."""
        self._api, self._checks, self._ca, self._clock = certificates, dict(checks), ca, clock
        self._monotonic, self._stale_after = monotonic, stale_after
        self._last_pass = monotonic()  # built: the first pass is due within ``stale_after``
        self._passes = 0
        self._decisions: Counter[str] = Counter()
        self._leader, self._leading = leader, leader is None

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
            waiting: Counter[str] = Counter()
            for csr in sorted((c for c in pending if c.spec.signer_name == signer and not _decided(c)), key=_created):
                who = _requester(csr)
                waiting[who] += 1
                if waiting[who] > MAX_PENDING:
                    outcome = self._deny(csr.metadata.name, f"more than {MAX_PENDING} pending requests from {who}")
                else:
                    outcome = self._decide(csr, check, server=signer == AGENT_SIGNER)
                counts[outcome] += 1
        self._decisions.update(counts)
        self._passes += 1
        self._last_pass = self._monotonic()
        return counts

    def _deny(self, name: str, why: str) -> str:
        log.warning("identity request %s denied: %s", name, why)
        self._patch_approval(name, _condition("Denied", "IdentityRefused", why, self._clock()))
        return "denied"

    def _decide(self, csr: Any, check: Check, server: bool) -> str:
        name, now = csr.metadata.name, self._clock()
        try:
            request, lifetime = check(csr.spec)
            cert = issue(request, *self._ca, lifetime, now, server=server)
        except Refused as why:
            return self._deny(name, str(why))
        except DriverError as exc:  # the facts could not be read: undecided, tried again next pass
            log.warning("identity request %s left for the next pass: %s", name, exc)
            return "left"
        except Exception as exc:  # whatever else one request makes the check or the signing raise
            log.warning("identity request %s could not be checked", name, exc_info=True)
            return self._deny(name, f"the request could not be checked: {type(exc).__name__}")
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
        """Decide pending requests every ``every`` seconds until ``stop`` is set (a background loop); a pass
        that fails is logged and the next one runs."""
        while not stop.wait(every):
            try:
                self._leading = self._leader is None or self._leader()
                if self._leading:
                    self.pass_once()
                else:
                    self._last_pass = self._monotonic()  # standing by: alive, another replica signs
            except Exception:
                log.exception("identity signer: the pass failed; trying again in %.0fs", every)

    def health(self) -> Health:
        """Ready while passes end: not ready after ``stale_after`` seconds without one."""
        age = self._monotonic() - self._last_pass
        if age > self._stale_after:
            return Health(False, f"identity signer: no pass has ended for {age:.0f}s")
        return Health(True, "identity signer passing")

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield CounterMetricFamily(
            "nvmeof_csi_identity_signer_passes", "Passes of the identity signer over pending requests.", self._passes
        )
        decided = CounterMetricFamily(
            "nvmeof_csi_identity_signer_requests", "Identity requests decided, by outcome.", labels=["outcome"]
        )
        for outcome in ("issued", "denied", "left"):
            decided.add_metric([outcome], self._decisions[outcome])
        yield decided
        yield GaugeMetricFamily(
            "nvmeof_csi_identity_signer_leading", "1 while this replica is the one that signs.", int(self._leading)
        )
        yield GaugeMetricFamily(
            "nvmeof_csi_identity_signer_seconds_since_pass",
            "Seconds since the identity signer last ended a pass (liveness).",
            self._monotonic() - self._last_pass,
        )


def _status(exc: Exception) -> str:
    return f"{type(exc).__name__} {getattr(exc, 'status', '')} {getattr(exc, 'reason', '')}".strip()
