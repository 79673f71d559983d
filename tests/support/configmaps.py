"""A stand-in for the ConfigMap calls of ``kubernetes.client.CoreV1Api`` that the identity bindings make: read
and replace with the API server's optimistic concurrency (a stale resourceVersion is a 409 conflict)."""

from __future__ import annotations

import datetime
from types import SimpleNamespace
from typing import Any

from nvmeof_csi.kube.bindings import NodeBindings


class ApiError(Exception):
    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason = status, reason


class ConfigMaps:
    """One namespace's ConfigMaps: name -> (data, resourceVersion); a replace is a PUT: the body's labels and
    annotations become the object's (``meta``), whatever it had."""

    def __init__(self, *names: str) -> None:
        self.maps: dict[str, tuple[dict[str, str], int]] = {n: ({}, 1) for n in names}
        self.meta: dict[str, dict[str, dict[str, str]]] = {n: {"labels": {}, "annotations": {}} for n in names}
        self.reads = 0

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> SimpleNamespace:
        self.reads += 1
        if name not in self.maps:
            raise ApiError(404, "Not Found")
        data, version = self.maps[name]
        meta = self.meta[name]
        return SimpleNamespace(
            data=dict(data) or None,
            metadata=SimpleNamespace(resource_version=str(version), labels=dict(meta["labels"]) or None,
                                     annotations=dict(meta["annotations"]) or None),
        )  # fmt: skip

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        version = self.maps[name][1]
        if body["metadata"]["resourceVersion"] != str(version):
            raise ApiError(409, "Conflict")
        self.maps[name] = (dict(body.get("data") or {}), version + 1)
        metadata = body["metadata"]
        self.meta[name] = {
            "labels": dict(metadata.get("labels") or {}),
            "annotations": dict(metadata.get("annotations") or {}),
        }


def bound(api: ConfigMaps | None = None, name: str = "bindings") -> tuple[NodeBindings, ConfigMaps]:
    """Bindings over a fresh (or the given) stand-in API."""
    api = api or ConfigMaps(name)
    return NodeBindings(api, "nvmeof-csi", name), api


def binder(bindings: NodeBindings, now: datetime.datetime) -> Any:
    """The signer's ``bind`` hook over ``bindings`` at a fixed time."""
    return lambda nqn, node, lifetime: bindings.bind(nqn, node, now + lifetime, now)
