"""What every nvmeofctl command shares: the agents to talk to and the output format.

Targets come from ``--agent ENDPOINT`` (one agent) or a YAML file (``--targets``, default
``$NVMEOFCTL_TARGETS`` or ``/etc/nvmeof-csi/targets.yaml``)::

    targets:
      - name: store-a
        endpoint: unix:///run/nvmeof-csi/agent.sock
      - name: store-b
        endpoint: tcp://store-b.example:9440
        tls: {cert: /etc/nvmeofctl/client.crt, key: /etc/nvmeofctl/client.key, ca: /etc/nvmeofctl/ca.crt}
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
import yaml

from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.errors import ConfigError, InvalidArgument, NotFound
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles

DEFAULT_TARGETS = Path("/etc/nvmeof-csi/targets.yaml")


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


@dataclass
class CliState:
    targets: list[AgentTarget] = field(default_factory=list)
    output: Output = Output.TABLE
    timeout: float = 30.0

    def pick(self, name: str | None) -> list[AgentTarget]:
        if not self.targets:
            raise ConfigError("no agents configured: pass --agent ENDPOINT or a --targets file")
        if name is None:
            return self.targets
        chosen = [t for t in self.targets if t.name == name]
        if not chosen:
            raise ConfigError(f"no target named {name!r} (known: {', '.join(t.name for t in self.targets)})")
        return chosen

    def one(self, name: str | None) -> AgentTarget:
        chosen = self.pick(name)
        if len(chosen) != 1:
            raise ConfigError("several targets are configured: choose one with --target")
        return chosen[0]

    def locate(self, volume: str, name: str | None) -> tuple[AgentTarget, str]:
        """(the target holding it, its UUID) for ``volume``: a CSI volume handle (``nvmeof-v1.<agent>.<uuid>``:
        the handle names the agent, no ``--target`` needed), a UUID, or a CSI volume name (the PV's name,
        ``pvc-...``). A UUID or a name is looked for on the targets (``--target``: on that one only);
        ``NotFound`` when none holds it."""
        location, vol_uuid, csi_name = parse_volume(volume)
        if location is not None:
            if name is not None and name != location:
                raise ConfigError(f"volume handle {volume!r} names agent {location!r}, not --target {name!r}")
            return self.pick(location)[0], str(vol_uuid)
        candidates = self.pick(name)
        if vol_uuid is not None and len(candidates) == 1:
            return candidates[0], vol_uuid
        for target in candidates:
            with self.client(target) as client:
                try:
                    found = client.get_volume(vol_uuid=vol_uuid) if vol_uuid else client.get_volume(name=csi_name or "")
                except NotFound:
                    continue
            return target, str(found.uuid)
        raise NotFound(f"volume {volume!r} is on none of the targets ({', '.join(t.name for t in candidates)})")

    @contextmanager
    def client(self, target: AgentTarget) -> Iterator[AgentClient]:
        with AgentClient(target, self.timeout) as client:
            yield client


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def parse_volume(text: str) -> tuple[str | None, str | None, str | None]:
    """(target, uuid, name) from a CSI volume ID ``nvmeof-v1.<target>.<uuid>``, a UUID, or a CSI name."""
    if text.startswith("nvmeof-v1."):
        location, _, vol_uuid = text[len("nvmeof-v1.") :].rpartition(".")
        if not location or not UUID.match(vol_uuid):
            raise InvalidArgument(f"{text[:140]!r} is not a volume ID of this driver")
        return location, vol_uuid, None
    if UUID.match(text.lower()):
        return None, text.lower(), None
    return None, None, text


def _target(entry: Any, source: str) -> AgentTarget:
    if not isinstance(entry, dict) or "name" not in entry or "endpoint" not in entry:
        raise ConfigError(f"{source}: each target needs 'name' and 'endpoint'")
    tls = entry.get("tls")
    files = TlsFiles.from_options(*(Path(tls[k]) if k in tls else None for k in ("cert", "key", "ca"))) if tls else None
    return AgentTarget(
        name=str(entry["name"]),
        endpoint=Endpoint.parse(str(entry["endpoint"])),
        tls=files,
        allow_plaintext_loopback=bool(entry.get("allowPlaintextLoopback", False)),
    )


def load_targets(path: Path | None, agent: str | None) -> list[AgentTarget]:
    if agent:
        return [_target({"name": "agent", "endpoint": agent, "allowPlaintextLoopback": True}, "--agent")]
    file = path or DEFAULT_TARGETS
    if not file.exists():
        if path is not None:
            raise ConfigError(f"targets file {file} does not exist")
        return []
    try:
        doc = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"targets file {file} is not valid YAML: {exc}") from exc
    entries = doc.get("targets") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"targets file {file} needs a 'targets:' list")
    return [_target(e, str(file)) for e in entries]


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliState)
    return obj
