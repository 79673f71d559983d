"""NVMe/TCP TLS pre-shared keys (TP 8011) in their interchange form, and the identity the kernel looks them up by
(no I/O).

Key model: as for DH-HMAC-CHAP keys (``nvmeof/dhchap.py``), a PSK is per host, never per volume, and nothing a
node holds lets it derive another node's PSK. Each agent issues a random 32-byte PSK to each host the first time it
allows that host on a ``tls: psk`` volume, keeps it in its state (0600), and gives the same PSK to that host for
every other such volume. The agent puts it in its kernel's ``.nvme`` keyring under the host's identity for each
subsystem the host may reach; the node fetches its own PSK from the volume's agent (``GetHostKeys``, bound to its
certificate's host NQN) and puts it in its own ``.nvme`` keyring under the same identity; the kernel's TLS
handshake daemon (``tlshd``) on each side finds it there.

Identity: ``NVMe0R01 <host NQN> <subsystem NQN>`` (a retained PSK, HMAC SHA-256: what a 6.12 kernel looks up
first for a TLS connect without a named key). Interchange form: ``NVMeTLSkey-1:01:<base64(psk || crc32le(psk))>:``.

Contract: :func:`format_psk` / :func:`parse_psk` are each other's inverse; :func:`parse_psk` raises
``InvalidArgument`` for anything malformed (never echoing the key); :func:`check_tls` validates a ``tls`` value.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import struct
import zlib

from nvmeof_csi.errors import InvalidArgument

#: ``tls`` parameter values: clear text, or TLS 1.3 with a per-host pre-shared key.
TLS_MODES = ("none", "psk")
PSK_LENGTH = 32
_TEXT = re.compile(r"NVMeTLSkey-1:01:([A-Za-z0-9+/=]+):")


def check_tls(mode: str) -> str:
    """``mode`` when it is a known ``tls`` value, else ``InvalidArgument`` naming the choices."""
    if mode not in TLS_MODES:
        raise InvalidArgument(f"parameter 'tls' must be one of {', '.join(TLS_MODES)}, not {mode[:40]!r}")
    return mode


def format_psk(key: bytes) -> str:
    """``key`` (32 bytes) in interchange form."""
    if len(key) != PSK_LENGTH:
        raise InvalidArgument(f"an NVMe/TCP PSK is {PSK_LENGTH} bytes")
    return f"NVMeTLSkey-1:01:{base64.b64encode(key + struct.pack('<I', zlib.crc32(key))).decode()}:"


def generate_psk() -> str:
    """A new random PSK (the operating system's CSPRNG) in interchange form."""
    return format_psk(secrets.token_bytes(PSK_LENGTH))


def parse_psk(text: str) -> bytes:
    """The PSK's bytes from interchange form; ``InvalidArgument`` (without the key) when malformed."""
    match = _TEXT.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument("an NVMe/TCP PSK must look like NVMeTLSkey-1:01:<base64>:")
    try:
        raw = base64.b64decode(match.group(1), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument("an NVMe/TCP PSK's body is not base64") from exc
    key, crc = raw[:-4], raw[-4:]
    if len(key) != PSK_LENGTH or struct.pack("<I", zlib.crc32(key)) != crc:
        raise InvalidArgument("an NVMe/TCP PSK has the wrong length or checksum (mistyped or truncated)")
    return key


def identity(host_nqn: str, subsystem_nqn: str) -> str:
    """The PSK identity the kernel looks up for ``host_nqn`` connecting to ``subsystem_nqn``."""
    return f"NVMe0R01 {host_nqn} {subsystem_nqn}"
