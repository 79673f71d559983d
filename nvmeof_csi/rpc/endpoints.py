"""Where a gRPC server listens or a client connects (``unix:///path`` or ``tcp://HOST:PORT``), the mutual-TLS
files that go with TCP, and the loopback rule for plaintext.

Contract: :meth:`Endpoint.parse` and :class:`TlsFiles` raise ``ConfigError`` naming what is wrong;
:func:`is_loopback` parses the host as an address (names other than ``localhost`` are not loopback).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.errors import ConfigError


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


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and for addresses in 127.0.0.0/8 or ``::1`` (brackets allowed); a name or a
    malformed address is not loopback."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TlsFiles:
    """Mutual TLS: our certificate and key, and the CA that signs the peers we accept."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def from_options(cls, cert: Path | None, key: Path | None, ca: Path | None) -> TlsFiles | None:
        """All three files, or none (no TLS); anything in between is a configuration error."""
        if cert is None and key is None and ca is None:
            return None
        if cert is None or key is None or ca is None:
            raise ConfigError("tls-cert, tls-key and tls-ca go together")
        return cls(cert, key, ca)

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            path = getattr(self, name)
            if not path.is_file():
                raise ConfigError(f"tls-{name} {path} is not a readable file")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ``ConfigError`` otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"listen address {text!r} must be HOST:PORT")
    return host, int(port)
