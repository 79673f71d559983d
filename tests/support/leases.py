"""A stand-in for the Lease calls of ``kubernetes.client.CoordinationV1Api`` over one namespace, with the API
server's optimistic concurrency (a stale resourceVersion is a 409 conflict; creating an existing one too)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.support.configmaps import ApiError


class Leases:
    def __init__(self) -> None:
        self.leases: dict[str, tuple[dict[str, Any], int]] = {}  # name -> (body, resourceVersion)
        self.down = False

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> SimpleNamespace:
        if self.down:
            raise ApiError(503, "Service Unavailable")
        if name not in self.leases:
            raise ApiError(404, "Not Found")
        body, version = self.leases[name]
        spec = body["spec"]
        fields = {"holder_identity": spec.get("holderIdentity"), "renew_time": spec.get("renewTime"),
                  "acquire_time": spec.get("acquireTime")}  # fmt: skip
        metadata = SimpleNamespace(resource_version=str(version), annotations=body["metadata"].get("annotations"))
        return SimpleNamespace(spec=SimpleNamespace(**fields), metadata=metadata)

    def spec(self, name: str) -> dict[str, Any]:
        spec: dict[str, Any] = self.leases[name][0]["spec"]
        return spec

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        name = body["metadata"]["name"]
        if name in self.leases:
            raise ApiError(409, "AlreadyExists")
        self.leases[name] = (body, 1)

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        version = self.leases[name][1]
        if body["metadata"].get("resourceVersion") != str(version):
            raise ApiError(409, "Conflict")
        self.leases[name] = (body, version + 1)

    def list_namespaced_lease(self, namespace: str, **_: Any) -> SimpleNamespace:
        if self.down:
            raise ApiError(503, "Service Unavailable")
        return SimpleNamespace(items=[SimpleNamespace(metadata=SimpleNamespace(name=n)) for n in sorted(self.leases)])

    def delete_namespaced_lease(self, name: str, namespace: str, **_: Any) -> None:
        if self.leases.pop(name, None) is None:
            raise ApiError(404, "Not Found")
