"""The fabric map: which target agents exist, how to reach them, and which storage fabric (and zone) each
one serves. A YAML file, typically mounted from a ConfigMap::

    agents:
      - name: store-a                       # DNS label; becomes the location in volume IDs
        endpoint: tcp://10.0.0.5:9440       # or unix:///run/nvmeof-csi/agent.sock
        node: storage-a                     # the Kubernetes Node it runs on (issued identities: only there)
        tls: {cert: /tls/tls.crt, key: /tls/tls.key, ca: /tls/ca.crt}
        fabric: rack-1                      # topology.csi.nvmeof.io/fabric of the nodes that reach it
        zone: zone-a                        # optional: topology.kubernetes.io/zone
        transports: [tcp, rdma]             # transports its portals offer

Contract: :func:`load_fabric_map` validates everything and raises ``ConfigError`` naming the entry and the
field; names are unique.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nvmeof_csi.errors import ConfigError
from nvmeof_csi.nvmeof.context import TRANSPORTS
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles
from nvmeof_csi.service.contracts import valid_location, valid_node_name


@dataclass(frozen=True)
class AgentEntry:
    name: str
    endpoint: Endpoint
    fabric: str
    zone: str = ""
    transports: tuple[str, ...] = ("tcp",)
    tls: TlsFiles | None = None
    allow_plaintext_loopback: bool = False
    alluxio_host: str = ""  # the Alluxio worker next to this agent: data sets it caches are local here
    node: str = ""  # the Kubernetes Node that runs it: the signer issues its server identity to a pod there only
    #: a map read ``ca_only`` (a node with its own identity): the CA that checks this agent, ``tls`` is None
    ca: Path | None = None


@dataclass(frozen=True)
class FabricMap:
    agents: tuple[AgentEntry, ...]

    def agent(self, name: str) -> AgentEntry | None:
        return next((a for a in self.agents if a.name == name), None)


def _str(raw: dict[str, Any], key: str, where: str, required: bool = False) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key!r} must be a string, not {type(value).__name__}")
    if required and not value:
        raise ConfigError(f"{where}: {key!r} is required")
    return value


def _tls(raw: dict[str, Any], where: str, ca_only: bool) -> tuple[TlsFiles | None, Path | None]:
    """(our files, None), or with ``ca_only`` (None, the CA: cert and key are the caller's own)."""
    tls_raw = raw.get("tls")
    if tls_raw is None:
        return None, None
    if not isinstance(tls_raw, dict) or set(tls_raw) - {"cert", "key", "ca"}:
        raise ConfigError(f"{where}: tls must be a mapping of cert, key and ca")
    files = [_str(tls_raw, k, f"{where} tls") for k in ("cert", "key", "ca")]
    if not ca_only:
        return TlsFiles.from_options(*(Path(f) if f else None for f in files)), None
    if not files[2] or not Path(files[2]).is_file():
        raise ConfigError(f"{where}: tls ca {files[2]!r} is not a readable file")
    return None, Path(files[2])


def _entry(raw: Any, index: int, ca_only: bool) -> AgentEntry:
    where = f"fabric map agents[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    known = {"name", "endpoint", "node", "fabric", "zone", "transports", "tls", "allowPlaintextLoopback", "alluxioHost"}
    if unknown := sorted(set(raw) - known):
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    name, fabric = _str(raw, "name", where, True), _str(raw, "fabric", where, True)
    if not valid_location(name):
        raise ConfigError(f"{where}: name {name!r} must be a DNS label")
    if not valid_location(fabric):
        raise ConfigError(f"{where}: fabric {fabric!r} must be a DNS label")
    transports = raw.get("transports", ["tcp"])
    if not isinstance(transports, list) or not transports or any(t not in TRANSPORTS for t in transports):
        raise ConfigError(f"{where}: transports must be a non-empty list of {', '.join(TRANSPORTS)}")
    plaintext = raw.get("allowPlaintextLoopback", False)
    if not isinstance(plaintext, bool):
        raise ConfigError(f"{where}: allowPlaintextLoopback must be true or false (a YAML boolean)")
    tls, ca = _tls(raw, where, ca_only)
    node = _str(raw, "node", where)
    if node and not valid_node_name(node):
        raise ConfigError(f"{where}: node {node[:80]!r} must be a Kubernetes Node name (a DNS subdomain)")
    return AgentEntry(
        name=name,
        endpoint=Endpoint.parse(_str(raw, "endpoint", where, True)),
        fabric=fabric,
        zone=_str(raw, "zone", where),
        transports=tuple(transports),
        tls=tls,
        allow_plaintext_loopback=plaintext,
        alluxio_host=_str(raw, "alluxioHost", where),
        node=node,
        ca=ca,
    )


def parse_fabric_map(doc: Any, ca_only: bool = False) -> FabricMap:
    """``ca_only``: each agent's ``tls`` gives only the CA that checks it (a node whose certificate is its own)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("agents"), list) or not doc["agents"]:
        raise ConfigError("fabric map needs a non-empty 'agents:' list")
    agents = tuple(_entry(raw, i, ca_only) for i, raw in enumerate(doc["agents"]))
    names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise ConfigError(f"fabric map: agent names must be unique, got {names}")
    return FabricMap(agents)


def load_fabric_map(path: Path, ca_only: bool = False) -> FabricMap:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"fabric map {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"fabric map {path} is not valid YAML: {exc}") from exc
    return parse_fabric_map(doc, ca_only)
