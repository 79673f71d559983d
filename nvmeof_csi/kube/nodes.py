"""What the Kubernetes API says about a node, for fencing (``service/fencing.py``): whether it carries the
out-of-service taint, and its boot ID, looked up by CSI node ID through the official Kubernetes client.

A CSI node ID names no Kubernetes object by itself: this driver's entry in each CSINode (``spec.drivers[].nodeID``)
maps it to the Node's name. The map is read by listing CSINodes, again when an ID is missing from it or it is
older than ``ttl`` seconds. Least privilege (``deploy/``): ``get`` on nodes, ``list`` on csinodes.

Contract: :meth:`KubeNodes.out_of_service` is ``False`` for a node the API does not know (no CSINode entry, or
its Node is gone: nothing to fence it by) and :meth:`KubeNodes.boot_id` is ``""`` then; an API that cannot be
asked (connection refused, 5xx, forbidden) raises ``Unavailable`` naming what failed, so the CO retries rather
than the driver guessing. :meth:`KubeNodes.connect` checks the kubeconfig or service account at once and makes the
client at the first question (:class:`LazyApi`), so that a pod serves without waiting for the client's import.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvmeof_csi.errors import Unavailable

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
BOOT_ID = re.compile(r"[0-9a-fA-F-]{1,64}")


SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def api_client(kubeconfig: str) -> Any:
    """A ``kubernetes.client.ApiClient`` from a kubeconfig path, or the pod's service account for ``""``."""
    client = importlib.import_module("kubernetes.client")  # imported only where there is a cluster
    config = importlib.import_module("kubernetes.config")
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


def preflight(kubeconfig: str) -> None:
    """What :func:`api_client` would refuse at once, found without importing the client: ``OSError`` for a
    kubeconfig that cannot be read, or, for ``""``, a pod without the API's address or its service account's
    token and CA (``ValueError``)."""
    if kubeconfig:
        with open(kubeconfig, "rb"):
            return
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")):
        raise ValueError("KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?)")
    for name in ("token", "ca.crt"):
        if not (SERVICE_ACCOUNT / name).is_file():
            raise ValueError(f"{SERVICE_ACCOUNT / name} is missing (no service account token mounted)")


class LazyApi:
    """A Kubernetes API object made by ``make`` at its first use rather than when the process starts: the
    official client's import takes 10-40 s of CPU on a small node (every model class), and a pod should serve
    before it. ``make`` runs once, under a lock, in the first user's thread; an error in it is raised to that
    user (every use site turns the client's errors into "cannot ask now") and the next use tries again."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make: Callable[[], Any] = make
        self._made: Any = None
        self._lock = threading.Lock()

    def made(self) -> Any:
        with self._lock:
            if self._made is None:
                self._made = self._make()
            return self._made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)


def lazy_api(kubeconfig: str, kind: str) -> LazyApi:
    """``kubernetes.client.<kind>`` (e.g. ``CertificatesV1Api``) on :func:`api_client`, made at its first use."""
    return LazyApi(lambda: getattr(importlib.import_module("kubernetes.client"), kind)(api_client(kubeconfig)))


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
    def connect(cls, kubeconfig: str, driver: str, now: bool = False) -> KubeNodes:
        """From a kubeconfig path, or the pod's service account when ``kubeconfig`` is ``""``: checked at once
        (:func:`preflight`), the client made at the first question (:class:`LazyApi`), or here with ``now``."""
        preflight(kubeconfig)
        api = LazyApi(lambda: api_client(kubeconfig))

        def made(kind: str) -> LazyApi:
            return LazyApi(lambda: getattr(importlib.import_module("kubernetes.client"), kind)(api.made()))

        core, storage = made("CoreV1Api"), made("StorageV1Api")
        if now:
            core.made()
            storage.made()
        return cls(core, storage, driver)

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
                node = str((item.get("metadata") or {}).get("name") or "")
                for d in (item.get("spec") or {}).get("drivers") or [] if node else []:  # a nameless item: skipped
                    if d.get("name") == self._driver and d.get("nodeID"):
                        names.setdefault(str(d["nodeID"]), []).append(node)
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
        """Whether a Node that claims ``node_id`` carries the out-of-service taint. When several claim it (one
        host identity on two machines), any one tainted is enough: ambiguity fences, it never passes."""
        return any(self._tainted(name, node_id) for name in self.claimed_by(node_id))

    def _tainted(self, name: str, node_id: str) -> bool:
        try:
            node = self._core.read_node(name, _request_timeout=10)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return False
            raise Unavailable(f"cannot read Node {name} (node {node_id!r}): {_why(exc)}") from exc
        taints = (node.spec.taints or []) if node.spec is not None else []
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
