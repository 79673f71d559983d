"""What the Kubernetes API says about a node, for fencing (``service/fencing.py``): whether it carries the
out-of-service taint, and its boot ID, looked up by CSI node ID through the official Kubernetes client.

A CSI node ID names no Kubernetes object by itself: this driver's entry in each CSINode (``spec.drivers[].nodeID``)
maps it to the Node's name. The map is read by listing CSINodes, again when an ID is missing from it or it is
older than ``ttl`` seconds. Least privilege (``deploy/``): ``get`` on nodes, ``list`` on csinodes.

Contract: :meth:`KubeNodes.out_of_service` is ``False`` for a node the API does not know (no CSINode entry, or
its Node is gone: nothing to fence it by) and :meth:`KubeNodes.boot_id` is ``""`` then; an API that cannot be
asked (connection refused, 5xx, forbidden) raises ``Unavailable`` naming what failed, so the CO retries rather
than the driver guessing. :meth:`KubeNodes.node_of` names the Node a node ID is: the one the signer bound its
identity to (``kube/bindings.py``), else its one claimant. :meth:`KubeNodes.connect` checks the kubeconfig or
service account at once and makes the client at the first question (:class:`LazyApi`), so that a pod serves
without waiting for the client's import.
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
from nvmeof_csi.kube.api import LazyApi, api_client, api_error, preflight
from nvmeof_csi.kube.bindings import NodeBindings

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
BOOT_ID = re.compile(r"[0-9a-fA-F-]{1,64}")


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
        self.bindings: NodeBindings | None = None  # the signer's durable NQN -> Node bindings, once it has them

    def bind_identities(self, namespace: str, name: str) -> NodeBindings:
        """The durable bindings in ConfigMap ``namespace/name``, kept here for :meth:`node_of`."""
        self.bindings = NodeBindings(self._core, namespace, name)
        return self.bindings

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

    def claimed_by(self, node_id: str, fresh: bool = False) -> list[str]:
        """The Nodes whose CSINode lists ``node_id``: from the list read within ``ttl`` seconds, or read now
        with ``fresh`` (what an identity is issued on is never a cached fact)."""
        with self._lock:
            if not fresh and node_id in self._names and self._clock() - self._read_at < self._ttl:
                return list(self._names[node_id])
            try:
                # the list as JSON, not the client's models: those refuse a CSINode without drivers (a node
                # where no CSI driver registered, such as a storage node), so one such node would hide all
                raw = self._storage.list_csi_node(_request_timeout=10, _preload_content=False)
                listed = json.loads(raw.data)
            except Exception as exc:  # the client's errors are many types: each is one answer, "cannot ask"
                raise Unavailable(f"cannot list CSINodes to find node {node_id!r}: {api_error(exc)}") from exc
            names: dict[str, list[str]] = {}
            for item in listed.get("items") or []:
                node = str((item.get("metadata") or {}).get("name") or "")
                for d in (item.get("spec") or {}).get("drivers") or [] if node else []:  # a nameless item: skipped
                    if d.get("name") == self._driver and d.get("nodeID"):
                        names.setdefault(str(d["nodeID"]), []).append(node)
            self._names, self._read_at = {k: sorted(v) for k, v in names.items()}, self._clock()
            return list(self._names.get(node_id, []))

    def node_of(self, node_id: str) -> str:
        """The Node ``node_id`` is: the one its identity was last bound to (the API server attested it to the
        signer), else the one Node whose CSINode claims it, else ``""`` (none, or several)."""
        bound = self.bindings.node_of(node_id) if self.bindings is not None else ""
        return bound or self._node_name(node_id)

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
            raise Unavailable(f"cannot read Node {name} (node {node_id!r}): {api_error(exc)}") from exc

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
            raise Unavailable(f"cannot read Node {name} (node {node_id!r}): {api_error(exc)}") from exc
        taints = (node.spec.taints or []) if node.spec is not None else []
        return any(t.key == OUT_OF_SERVICE_TAINT for t in taints)

    def boot_id(self, node_id: str) -> str:
        node = self._node(node_id)
        if node is None or node.status is None or node.status.node_info is None:
            return ""
        boot = str(node.status.node_info.boot_id or "")
        return boot if BOOT_ID.fullmatch(boot) else ""  # a node writes its own status: never let it fail a fence
