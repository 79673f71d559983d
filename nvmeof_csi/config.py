"""Typed settings (frozen dataclasses). Built from flags and ``NVMEOF_CSI_*`` environment variables in
``main`` only, validated here with messages that name the setting; nothing else reads the environment.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from nvmeof_csi.csi.volume_id import valid_location

ENV_PREFIX = "NVMEOF_CSI_"


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is accepted."""


class Mode(StrEnum):
    CONTROLLER = "controller"
    NODE = "node"
    ALL = "all"

    @property
    def controller(self) -> bool:
        return self in (Mode.CONTROLLER, Mode.ALL)

    @property
    def node(self) -> bool:
        return self in (Mode.NODE, Mode.ALL)


class Backend(StrEnum):
    LOOP = "loop"  # development only


@dataclass(frozen=True)
class Endpoint:
    """Where the gRPC server listens: a unix socket path, or a TCP host and port."""

    scheme: str
    path: Path | None = None
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        if text.startswith("unix://"):
            raw = text[len("unix://") :]
            if not raw.startswith("/"):
                raise ConfigError(f"endpoint {text!r}: a unix socket path must be absolute (unix:///path/csi.sock)")
            return cls("unix", path=Path(raw))
        match = re.fullmatch(r"tcp://(\[[0-9a-fA-F:]+\]|[^:/\[\]]+):(\d{1,5})", text)
        if match:
            port = int(match.group(2))
            if not 0 < port < 65536:
                raise ConfigError(f"endpoint {text!r}: port must be 1..65535")
            return cls("tcp", host=match.group(1), port=port)
        raise ConfigError(f"endpoint {text!r} must be unix:///absolute/path or tcp://HOST:PORT")

    @property
    def grpc_address(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"unix://{self.path}" if self.scheme == "unix" else f"tcp://{self.host}:{self.port}"


@dataclass(frozen=True)
class Settings:
    """Everything ``nvmeof-csi serve`` needs; see ``--help`` for each field's flag and variable."""

    mode: Mode
    endpoint: Endpoint
    backend: Backend = Backend.LOOP
    state_dir: Path = Path("/var/lib/nvmeof-csi")
    node_id: str = ""
    fabric: str = "default"
    loop_capacity_bytes: int = 1 << 40
    max_volumes_per_node: int = 0
    grace_seconds: float = 30.0
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not self.node_id:
            object.__setattr__(self, "node_id", socket.gethostname())
        if len(self.node_id.encode()) > 192:
            raise ConfigError("node-id must be at most 192 bytes (CSI limit for node IDs)")
        if not valid_location(self.fabric):
            raise ConfigError(f"fabric {self.fabric!r} must be a DNS label (lowercase letters, digits, '-')")
        if self.loop_capacity_bytes <= 0:
            raise ConfigError("loop-capacity must be a positive number of bytes")
        if self.max_volumes_per_node < 0:
            raise ConfigError("max-volumes-per-node must be 0 (no limit) or more")
        if not 0 < self.grace_seconds <= 600:
            raise ConfigError("grace-seconds must be within (0, 600]")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("log-level must be DEBUG, INFO, WARNING or ERROR")
        if not self.state_dir.is_absolute():
            raise ConfigError(f"state-dir {self.state_dir} must be an absolute path")


def parse_size(text: str) -> int:
    """``10G``, ``512Mi``, ``1T`` or plain bytes -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGTP]?)(i?B?)?\s*", text, re.IGNORECASE)
    if not match:
        raise ConfigError(f"size {text!r} must be a number with an optional K/M/G/T/P suffix")
    power = " KMGTP".index(match.group(2).upper() or " ")
    return int(match.group(1)) << (10 * power)
