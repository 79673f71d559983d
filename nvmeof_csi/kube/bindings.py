"""Durable bindings of host NQNs (CSI node IDs) to the Kubernetes Nodes their identities were issued to, kept
in one ConfigMap of the driver's namespace (the chart makes it; the controller may only get and update it).

The signer (``issuance/signer.py``) binds a host NQN to the requesting Node, whose name the API server attested
(the pod-bound token's node claim), before it issues that NQN's certificate; ControllerPublishVolume reads the
binding to record in the grant which Node the host is (``agent/hosts.py``), so that an agent gives the host's
keys only to a certificate of that Node.

Contract: :meth:`NodeBindings.bind` binds ``nqn`` to ``node`` until ``until`` and returns ``""``, or returns why
not when the NQN is bound to another Node whose binding has not expired (a certificate of it may be live): a
binding is never moved while it lasts. Each call reads the ConfigMap afresh (never a cache) and writes it with its
resourceVersion, so two signers never both win, keeping its labels, annotations and any key not a binding; anything
the API refuses raises ``Unavailable`` (the request is decided at the next pass). :meth:`NodeBindings.node_of` is
the Node an NQN was last bound to (``""``: never), expired or not: publishing follows the last attested Node.
Bindings expired for more than :data:`KEEP_EXPIRED` are dropped when the map is written.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

from nvmeof_csi.errors import ConfigError, Unavailable
from nvmeof_csi.kube.api import api_error

KEEP_EXPIRED = datetime.timedelta(days=30)


def _key(nqn: str) -> str:
    """A ConfigMap key for an NQN (keys allow ``[-._a-zA-Z0-9]`` only; an NQN has ``:``)."""
    return "nqn-" + hashlib.sha256(nqn.encode()).hexdigest()[:40]


def parse_location(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` -> (namespace, name); ``ConfigError`` for anything else."""
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise ConfigError(f"--identity-bindings {value!r} must be NAMESPACE/NAME of a ConfigMap")
    return namespace, name


class NodeBindings:
    def __init__(self, core: Any, namespace: str, name: str) -> None:
        """``core``: ``kubernetes.client.CoreV1Api`` (or a stand-in)."""
        self._core, self._namespace, self._name = core, namespace, name

    def _read(self) -> tuple[dict[str, dict[str, str]], Any]:
        """(key -> binding, the ConfigMap as the API has it now)."""
        try:
            found = self._core.read_namespaced_config_map(self._name, self._namespace, _request_timeout=10)
        except Exception as exc:  # the client's errors are many types: each means "cannot ask now"
            raise Unavailable(f"cannot read the identity bindings {self._where()}: {api_error(exc)}") from exc
        bindings: dict[str, dict[str, str]] = {}
        for key, raw in (found.data or {}).items():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue  # not ours: kept as it is, never read as a binding
            if isinstance(entry, dict) and {"nqn", "node", "until"} <= set(entry):
                bindings[key] = {k: str(entry[k]) for k in ("nqn", "node", "until")}
        return bindings, found

    def node_of(self, nqn: str) -> str:
        entry = self._read()[0].get(_key(nqn))
        return entry["node"] if entry is not None and entry["nqn"] == nqn else ""

    def bind(self, nqn: str, node: str, until: datetime.datetime, now: datetime.datetime) -> str:
        bindings, found = self._read()
        key = _key(nqn)
        entry = bindings.get(key)
        if entry is not None and entry["nqn"] == nqn and entry["node"] != node:
            ends = _time(entry["until"])
            if ends > now:
                return f"host NQN {nqn[:230]!r} is bound to node {entry['node']!r} until {ends.isoformat()}"
        if entry is not None and entry["nqn"] == nqn and entry["node"] == node and _time(entry["until"]) >= until:
            return ""
        bindings = {k: v for k, v in bindings.items() if _time(v["until"]) + KEEP_EXPIRED > now}
        bindings[key] = {"nqn": nqn, "node": node, "until": until.isoformat()}
        data = {k: v for k, v in (found.data or {}).items() if not k.startswith("nqn-")}  # others' keys stay
        data.update({k: json.dumps(v, sort_keys=True) for k, v in sorted(bindings.items())})
        meta = found.metadata
        body = {  # a replace: the labels and annotations the chart gave it (keep, across uninstall) go back too
            "metadata": {
                "name": self._name,
                "namespace": self._namespace,
                "resourceVersion": str(meta.resource_version or ""),
                "labels": dict(getattr(meta, "labels", None) or {}),
                "annotations": dict(getattr(meta, "annotations", None) or {}),
            },
            "data": data,
        }
        try:
            self._core.replace_namespaced_config_map(self._name, self._namespace, body, _request_timeout=10)
        except Exception as exc:  # 409: another signer wrote first; read again at the next pass
            raise Unavailable(f"cannot write the identity bindings {self._where()}: {api_error(exc)}") from exc
        return ""

    def _where(self) -> str:
        return f"(ConfigMap {self._namespace}/{self._name})"


def _time(value: str) -> datetime.datetime:
    """A binding's ``until``; one that cannot be read counts as live for ever (fail closed)."""
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return datetime.datetime.max.replace(tzinfo=datetime.UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)
