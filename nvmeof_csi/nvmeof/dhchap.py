"""DH-HMAC-CHAP keys in their ``DHHC-1`` text form, and the per-host keys derived from one StorageClass secret
(no I/O; the groundwork for in-band host authentication).

Key model: nvmet keys are per host, not per volume. One secret per StorageClass (from a Kubernetes Secret) is
known to the controller and to the node plugins; each derives the same per-host key for a host NQN:
``HMAC-SHA256(secret, "nvmeof-csi dhchap host " + host NQN)`` (and, for bidirectional authentication, the
controller key with the label ``ctrl``). No per-node Secret is needed, and one node's leaked key opens no other
node: it is bound to that node's host NQN.

Text form (as the kernel's ``nvme_auth_extract_key`` reads it): ``DHHC-1:<hh>:<base64(key || crc32le(key))>:``,
``hh`` the key transformation (``00``: none), the key 32, 48 or 64 bytes, the CRC the standard CRC-32 of the key
in little-endian order.

The secret reaches the driver through the CSI secrets fields (``csi.storage.k8s.io/controller-publish-secret-*``
and ``node-stage-secret-*`` StorageClass parameters naming one Kubernetes Secret) under the key
:data:`SECRET_KEY`. nvmet keeps keys per host NQN, across every subsystem that allows the host: so every volume
with ``auth`` published to one node must use the same secret (one per cluster in practice), and a node that
holds an authenticated volume cannot also hold an ``auth: none`` volume of the same agent (the agent refuses
the mix with FAILED_PRECONDITION).

Contract: :func:`format_key` / :func:`parse_key` are each other's inverse; :func:`parse_key` raises
``InvalidArgument`` for anything malformed (never echoing the key); :func:`derive` raises ``InvalidArgument``
for a secret shorter than 32 bytes or an invalid host NQN; :func:`host_keys` gives the keys a mode needs, or
``InvalidArgument`` naming the missing secret key (never a value).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.context import check_auth
from nvmeof_csi.nvmeof.nqn import check_host_nqn

KEY_LENGTHS = (32, 48, 64)
TRANSFORMS = {0: "none", 1: "sha256", 2: "sha384", 3: "sha512"}
MIN_SECRET_BYTES = 32
#: the key of the Kubernetes Secret (CSI secrets map) holding the StorageClass secret
SECRET_KEY = "dhchapSecret"  # noqa: S105 - the name of a key, not a secret
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


def derive(secret: str, host_nqn: str, role: str = "host") -> str:
    """The ``role`` (``host`` or ``ctrl``) key of ``host_nqn`` derived from a StorageClass ``secret``."""
    if role not in ("host", "ctrl"):
        raise InvalidArgument(f"key role {role!r} must be host or ctrl")
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise InvalidArgument(f"the DH-HMAC-CHAP secret must be at least {MIN_SECRET_BYTES} bytes")
    check_host_nqn(host_nqn)
    digest = hmac.new(secret.encode(), f"nvmeof-csi dhchap {role} {host_nqn}".encode(), hashlib.sha256).digest()
    return format_key(digest)


@dataclass(frozen=True)
class HostKeys:
    """The keys of one host under one auth mode (``""``: not used). ``repr`` never shows a key."""

    key: str = ""
    ctrl_key: str = ""

    def __repr__(self) -> str:
        return f"HostKeys(key={'set' if self.key else 'none'}, ctrl_key={'set' if self.ctrl_key else 'none'})"

    __str__ = __repr__


def host_keys(mode: str, secrets: Mapping[str, str], host_nqn: str, what: str = "secret") -> HostKeys:
    """The keys ``host_nqn`` needs under ``mode`` (``AUTH_MODES``), derived from ``secrets[SECRET_KEY]``.
    ``what`` names the CSI secret in the error (e.g. "controller-publish secret")."""
    if check_auth(mode) == "none":
        return HostKeys()
    secret = secrets.get(SECRET_KEY, "")
    if not secret:
        raise InvalidArgument(
            f"the volume uses auth {mode!r} but the {what} has no {SECRET_KEY!r} key (set the StorageClass's "
            f"csi.storage.k8s.io/*-secret-name and -namespace parameters to a Secret holding it)"
        )
    ctrl = derive(secret, host_nqn, "ctrl") if mode == "dhchap-bidirectional" else ""
    return HostKeys(derive(secret, host_nqn), ctrl)
