"""Leadership among controller replicas for work that one of them must do alone (the identity signer), through
a ``coordination.k8s.io`` Lease in the driver's namespace, as Kubernetes' own leader election does.

Contract: :meth:`LeaseElector.lead` returns whether this replica leads now: it creates the Lease when there is
none, renews it while this replica holds it, and takes it over only once its holder has not renewed it for
``duration`` seconds. Every write carries the Lease's resourceVersion, so two replicas never both win; an API
that cannot be asked, or a write that lost a race, answers ``False`` (a replica that cannot renew stops leading
at once, and another takes over ``duration`` seconds after the last renewal). A leader renews at every call
(the caller calls well within ``duration``).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

from nvmeof_csi.kube.api import api_error

log = logging.getLogger(__name__)


def _micro(at: datetime.datetime) -> str:
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parsed(value: Any) -> datetime.datetime | None:
    """A Lease time as the client gives it (a datetime, or its text); ``None`` when absent or unreadable."""
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


class LeaseElector:
    def __init__(
        self,
        coordination: Any,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 30.0,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        """``coordination``: ``kubernetes.client.CoordinationV1Api`` (or a stand-in); ``identity``: this
        replica's name in the Lease (unique per process)."""
        self._api, self._namespace, self._name, self.identity = coordination, namespace, name, identity
        self._duration, self._clock = duration, clock
        self._leading = False

    def lead(self) -> bool:
        leading = self._try()
        if leading != self._leading:
            log.info("lease %s/%s: %s", self._namespace, self._name, "leading" if leading else "standing by")
            self._leading = leading
        return leading

    def release(self) -> None:
        """Give the Lease up on a clean stop (what client-go's ReleaseOnCancel does): the holder emptied, so
        another replica leads at its next call instead of ``duration`` seconds later (a rolling upgrade replaces
        the leader). Only a Lease this replica still holds is written, with its resourceVersion; a failure is
        logged, and the Lease then simply expires."""
        if not self._leading:
            return
        self._leading = False
        try:
            lease = self._api.read_namespaced_lease(self._name, self._namespace, _request_timeout=10)
        except Exception as exc:  # the client's errors are many types
            log.info("lease %s: not released (%s)", self._name, api_error(exc))
            return
        if str(getattr(lease.spec, "holder_identity", "") or "") != self.identity:
            return
        now = self._clock()
        body = self._body(now, now, str(lease.metadata.resource_version or ""))
        body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
        if self._write(self._api.replace_namespaced_lease, body):
            log.info("lease %s/%s: released", self._namespace, self._name)

    def _try(self) -> bool:
        now = self._clock()
        try:
            lease = self._api.read_namespaced_lease(self._name, self._namespace, _request_timeout=10)
        except Exception as exc:  # the client's errors are many types; 404: nobody leads yet
            if getattr(exc, "status", None) != 404:
                log.warning("lease %s: cannot read it: %s", self._name, api_error(exc))
                return False
            return self._write(self._api.create_namespaced_lease, self._body(now, now, ""), create=True)
        spec = lease.spec
        holder = str(getattr(spec, "holder_identity", "") or "")
        renewed = _parsed(getattr(spec, "renew_time", None))
        version = str(lease.metadata.resource_version or "")
        fresh = renewed is not None and now < renewed + datetime.timedelta(seconds=self._duration)
        if holder and holder != self.identity and fresh:
            return False  # another replica leads and renewed within the duration
        acquired = _parsed(getattr(spec, "acquire_time", None)) if holder == self.identity else None
        return self._write(self._api.replace_namespaced_lease, self._body(acquired or now, now, version))

    def _body(self, acquired: datetime.datetime, now: datetime.datetime, version: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self._name, "namespace": self._namespace}
        if version:
            metadata["resourceVersion"] = version
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self._duration),
                "acquireTime": _micro(acquired), "renewTime": _micro(now)}  # fmt: skip
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _write(self, method: Callable[..., Any], body: dict[str, Any], create: bool = False) -> bool:
        try:
            if create:
                method(self._namespace, body, _request_timeout=10)
            else:
                method(self._name, self._namespace, body, _request_timeout=10)
        except Exception as exc:  # 409: another replica wrote first
            log.info("lease %s: not taken (%s)", self._name, api_error(exc))
            return False
        return True
