"""DH-HMAC-CHAP keys in their ``DHHC-1`` text form (no I/O; the groundwork for in-band host authentication).

Key model: nvmet keys are per host, not per volume, and no node ever holds material from which another node's
key follows. Each agent issues a random key to each host the first time it allows that host on an ``auth``
volume (:func:`generate_key`; and, for bidirectional authentication, a random controller key), keeps it in its
state (0600) and gives the same keys to that host for every other volume it allows it on. The controller
holds no key material at all. A node fetches its own keys from the volume's agent when it stages the volume
(``GetHostKeys``; an agent gives role ``node`` only the keys of the host NQN its certificate is bound to) and
writes them to ``/dev/nvme-fabrics``. A node that holds an authenticated volume cannot also hold an ``auth:
none`` volume of the same agent (the agent refuses the mix with FAILED_PRECONDITION).

Text form (as the kernel's ``nvme_auth_extract_key`` reads it): ``DHHC-1:<hh>:<base64(key || crc32le(key))>:``,
``hh`` the key transformation (``00``: none), the key 32, 48 or 64 bytes, the CRC the standard CRC-32 of the key
in little-endian order.

Contract: :func:`format_key` / :func:`parse_key` are each other's inverse; :func:`parse_key` raises
``InvalidArgument`` for anything malformed (never echoing the key); :func:`generate_key` draws 32 bytes from the
operating system's CSPRNG.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import struct
import zlib
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument

KEY_LENGTHS = (32, 48, 64)
TRANSFORMS = {0: "none", 1: "sha256", 2: "sha384", 3: "sha512"}
#: what the agent sets for an authenticated host: the HMAC and the FFDHE group (forward secrecy)
HASH = "hmac(sha256)"
DHGROUP = "ffdhe2048"
_TEXT = re.compile(r"DHHC-1:([0-9a-f]{2}):([A-Za-z0-9+/=]+):")


def format_key(key: bytes, transform: int = 0) -> str:
    """``key`` in ``DHHC-1`` text form."""
    if len(key) not in KEY_LENGTHS or transform not in TRANSFORMS:
        raise InvalidArgument(f"a DH-HMAC-CHAP key is {', '.join(map(str, KEY_LENGTHS))} bytes with a known transform")
    crc = struct.pack("<I", zlib.crc32(key))
    return f"DHHC-1:{transform:02x}:{base64.b64encode(key + crc).decode()}:"


def generate_key() -> str:
    """A new random 32-byte key in ``DHHC-1`` text form (no transformation)."""
    return format_key(secrets.token_bytes(32))


def parse_key(text: str) -> tuple[bytes, int]:
    """The key and its transform from ``DHHC-1`` text; ``InvalidArgument`` (without the key) when malformed."""
    match = _TEXT.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument("a DH-HMAC-CHAP key must look like DHHC-1:00:<base64>:")
    transform = int(match.group(1), 16)
    try:
        raw = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument("a DH-HMAC-CHAP key's body is not base64") from exc
    key, crc = raw[:-4], raw[-4:]
    if transform not in TRANSFORMS or len(key) not in KEY_LENGTHS:
        raise InvalidArgument("a DH-HMAC-CHAP key has an unknown transform or length")
    if struct.pack("<I", zlib.crc32(key)) != crc:
        raise InvalidArgument("a DH-HMAC-CHAP key's checksum does not match (mistyped or truncated)")
    return key, transform


@dataclass(frozen=True)
class HostKeys:
    """The keys of one host under one auth mode (``""``: not used). ``repr`` never shows a key."""

    key: str = ""
    ctrl_key: str = ""
    tls_psk: str = ""  # a ``tls: psk`` volume's per-host PSK (``nvmeof/tlspsk.py``)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'set' if getattr(self, k) else 'none'}" for k in ("key", "ctrl_key", "tls_psk"))
        return f"HostKeys({shown})"

    __str__ = __repr__
