"""The fabric map: which target agents exist, how to reach them, and which storage fabric (and zone) each
one serves. A YAML file, typically mounted from a ConfigMap::

    agents:
      - name: store-a                       # DNS label; becomes the location in volume IDs
        endpoint: tcp://10.0.0.5:9440       # or unix:///run/nvmeof-csi/agent.sock
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
from nvmeof_csi.service.ports import valid_location


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


@dataclass(frozen=True)
class FabricMap:
    agents: tuple[AgentEntry, ...]

    def agent(self, name: str) -> AgentEntry | None:
        return next((a for a in self.agents if a.name == name), None)


def _entry(raw: Any, index: int) -> AgentEntry:
    where = f"fabric map agents[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    for key in ("name", "endpoint", "fabric"):
        if not raw.get(key):
            raise ConfigError(f"{where}: {key!r} is required")
    name = str(raw["name"])
    if not valid_location(name):
        raise ConfigError(f"{where}: name {name!r} must be a DNS label")
    transports = tuple(str(t) for t in raw.get("transports", ["tcp"]))
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or not transports:
        raise ConfigError(f"{where}: transports must be a non-empty list of {', '.join(TRANSPORTS)}")
    tls_raw = raw.get("tls")
    tls = None
    if tls_raw:
        if not isinstance(tls_raw, dict):
            raise ConfigError(f"{where}: tls must have cert, key and ca")
        tls = TlsFiles.from_options(*(Path(tls_raw[k]) if k in tls_raw else None for k in ("cert", "key", "ca")))
    endpoint = Endpoint.parse(str(raw["endpoint"]))
    entry = AgentEntry(
        name=name, endpoint=endpoint, fabric=str(raw["fabric"]), zone=str(raw.get("zone", "")),
        transports=transports, tls=tls, allow_plaintext_loopback=bool(raw.get("allowPlaintextLoopback", False)),
        alluxio_host=str(raw.get("alluxioHost", "")),
    )
    if not valid_location(entry.fabric):
        raise ConfigError(f"{where}: fabric {entry.fabric!r} must be a DNS label")
    return entry


def parse_fabric_map(doc: Any) -> FabricMap:
    if not isinstance(doc, dict) or not isinstance(doc.get("agents"), list) or not doc["agents"]:
        raise ConfigError("fabric map needs a non-empty 'agents:' list")
    agents = tuple(_entry(raw, i) for i, raw in enumerate(doc["agents"]))
    names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise ConfigError(f"fabric map: agent names must be unique, got {names}")
    return FabricMap(agents)


def load_fabric_map(path: Path) -> FabricMap:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"fabric map {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"fabric map {path} is not valid YAML: {exc}") from exc
    return parse_fabric_map(doc)
