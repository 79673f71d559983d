"""What the Kubernetes API says about a node, for fencing (``service/fencing.py``): whether it carries the
out-of-service taint, and its boot ID, looked up by CSI node ID through the official Kubernetes client.

A CSI node ID names no Kubernetes object by itself: this driver's entry in each CSINode (``spec.drivers[].nodeID``)
maps it to the Node's name. The map is read by listing CSINodes, again when an ID is missing from it or it is
older than ``ttl`` seconds. Least privilege (``deploy/``): ``get`` on nodes, ``list`` on csinodes.

Contract: :meth:`KubeNodes.out_of_service` is ``False`` for a node the API does not know (no CSINode entry, or
its Node is gone: nothing to fence it by) and :meth:`KubeNodes.boot_id` is ``""`` then; an API that cannot be
asked (connection refused, 5xx, forbidden) raises ``Unavailable`` naming what failed, so the CO retries rather
than the driver guessing.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from nvmeof_csi.errors import Unavailable

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
BOOT_ID = re.compile(r"[0-9a-fA-F-]{1,64}")


def api_client(kubeconfig: str) -> Any:
    """A ``kubernetes.client.ApiClient`` from a kubeconfig path, or the pod's service account for ``""``."""
    client = importlib.import_module("kubernetes.client")  # imported only where there is a cluster
    config = importlib.import_module("kubernetes.config")
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


class KubeNodes:
    def __init__(
        self, core: Any, storage: Any, driver: str, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``core`` and ``storage``: ``kubernetes.client.CoreV1Api`` and ``StorageV1Api`` (or stand-ins)."""
        self._core, self._storage, self._driver = core, storage, driver
        self._ttl, self._clock = ttl, clock
        self._names: dict[str, list[str]] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, kubeconfig: str, driver: str) -> KubeNodes:
        """From a kubeconfig path, or the pod's service account when ``kubeconfig`` is ``""``."""
        api = api_client(kubeconfig)
        client = importlib.import_module("kubernetes.client")
        return cls(client.CoreV1Api(api), client.StorageV1Api(api), driver)

    def claimed_by(self, node_id: str) -> list[str]:
        with self._lock:
            if node_id in self._names and self._clock() - self._read_at < self._ttl:
                return list(self._names[node_id])
            try:
                # the list as JSON, not the client's models: those refuse a CSINode without drivers (a node
                # where no CSI driver registered, such as a storage node), so one such node would hide all
                raw = self._storage.list_csi_node(_request_timeout=10, _preload_content=False)
                listed = json.loads(raw.data)
            except Exception as exc:  # the client's errors are many types: each is one answer, "cannot ask"
                raise Unavailable(f"cannot list CSINodes to find node {node_id!r}: {_why(exc)}") from exc
            names: dict[str, list[str]] = {}
            for item in listed.get("items") or []:
                for d in (item.get("spec") or {}).get("drivers") or []:
                    if d.get("name") == self._driver and d.get("nodeID"):
                        names.setdefault(str(d["nodeID"]), []).append(str(item["metadata"]["name"]))
            self._names, self._read_at = {k: sorted(v) for k, v in names.items()}, self._clock()
            return list(self._names.get(node_id, []))

    def _node_name(self, node_id: str) -> str:
        """The Node of ``node_id`` (``""`` when none, or when several claim it: no fence or unfence by a guess)."""
        claimants = self.claimed_by(node_id)
        return claimants[0] if len(claimants) == 1 else ""

    def _node(self, node_id: str) -> Any:
        name = self._node_name(node_id)
        if not name:
            return None
        try:
            return self._core.read_node(name, _request_timeout=10)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise Unavailable(f"cannot read Node {name} (node {node_id!r}): {_why(exc)}") from exc

    def out_of_service(self, node_id: str) -> bool | None:
        node = self._node(node_id)
        taints = (node.spec.taints or []) if node is not None and node.spec is not None else []
        return any(t.key == OUT_OF_SERVICE_TAINT for t in taints)

    def boot_id(self, node_id: str) -> str:
        node = self._node(node_id)
        if node is None or node.status is None or node.status.node_info is None:
            return ""
        boot = str(node.status.node_info.boot_id or "")
        return boot if BOOT_ID.fullmatch(boot) else ""  # a node writes its own status: never let it fail a fence

    def addresses(self, name: str) -> list[str]:
        """The addresses a Node reports (``status.addresses``; its kubelet writes them), by Node name; ``[]``
        for a Node the API does not know."""
        try:
            node = self._core.read_node(name, _request_timeout=10)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return []
            raise Unavailable(f"cannot read Node {name}: {_why(exc)}") from exc
        found = (node.status.addresses or []) if node.status is not None else []
        return [str(a.address) for a in found]


def _why(exc: Exception) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    return f"HTTP {status} {reason}" if status else f"{type(exc).__name__}: {exc}"[:200]
