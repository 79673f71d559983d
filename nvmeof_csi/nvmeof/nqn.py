"""Every NVMe Qualified Name rule of the driver, in one place (no I/O).

- Volume subsystems: ``nqn.2026-11.io.nvmeof:vol:<volume-uuid>`` (:func:`volume_nqn`); the namespace UUID is
  the volume UUID and its NGUID is derived from it (:func:`namespace_nguid`). Subsystems are always matched
  by their whole NQN (``vol1`` never matches ``vol10``); :func:`is_driver_nqn` tells the driver's subsystems
  from anyone else's. A volume with read-only hosts also has ``<volume NQN>:ro`` (:func:`readonly_nqn`), whose
  namespace refuses writes (``agent/readonly.py``) and has its own UUID (:func:`readonly_namespace_uuid`) so
  that one kernel may reach both subsystems (the host refuses a namespace ID it already sees elsewhere).
- Host NQNs: ``nqn.YYYY-MM.<domain>...``, at most 223 bytes, no whitespace, ``/`` or control characters; the
  pattern is anchored at both ends (a trailing newline or NUL is refused). Generated host NQNs are UUID NQNs
  (``nqn.2014-08.org.nvmexpress:uuid:<host-id>``, :func:`uuid_nqn`).
- Node IDs are host NQNs: a node plugin's NodeGetInfo returns its host NQN as the CSI node ID, so
  ControllerPublishVolume knows from the node ID alone which host to allow on the subsystem. A node ID that
  is not a valid NQN cannot belong to a node of this driver: NOT_FOUND (:func:`host_nqn_of`).
"""

from __future__ import annotations

import re
import uuid

from nvmeof_csi.errors import InvalidArgument, NotFound

VOLUME_NQN_PREFIX = "nqn.2026-11.io.nvmeof:vol:"
READONLY_SUFFIX = ":ro"
UUID_NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:"
MAX_NQN_BYTES = 223
MAX_NODE_ID_BYTES = 192  # CSI limit for node IDs; NQNs may be 223 bytes, ours are ~68
_HOST_NQN = re.compile(r"nqn\.\d{4}-\d{2}\.[^\s/\x00-\x1f\x7f]{1,215}")


def check_uuid(value: str, field: str) -> str:
    """``value`` when it is a canonical (lowercase, hyphenated) UUID, the only form volume and snapshot UUIDs
    take; else ``InvalidArgument`` naming ``field``."""
    try:
        canonical = str(uuid.UUID(value))
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"{field} {value[:100]!r} is not a UUID") from exc
    if canonical != value:
        raise InvalidArgument(f"{field} {value[:100]!r} is not a canonical UUID (expected {canonical})")
    return value


def volume_nqn(vol_uuid: str) -> str:
    """The subsystem NQN of the volume with UUID ``vol_uuid``."""
    return VOLUME_NQN_PREFIX + vol_uuid


def readonly_nqn(vol_uuid: str) -> str:
    """The subsystem NQN through which read-only hosts reach the volume with UUID ``vol_uuid``."""
    return volume_nqn(vol_uuid) + READONLY_SUFFIX


def readonly_namespace_uuid(vol_uuid: str) -> str:
    """The namespace UUID of the volume's read-only subsystem (derived from, and distinct from, the volume's)."""
    return str(uuid.uuid5(uuid.UUID(vol_uuid), "readonly"))


def is_driver_nqn(nqn: str) -> bool:
    """True for subsystems this driver creates (and may therefore release); never for anyone else's."""
    return nqn.startswith(VOLUME_NQN_PREFIX)


def namespace_nguid(vol_uuid: str) -> str:
    """The namespace NGUID, derived from (and distinct from) the volume UUID."""
    return str(uuid.uuid5(uuid.UUID(vol_uuid), "nguid"))


def uuid_nqn(host_id: str) -> str:
    """The UUID-based host NQN of a host ID."""
    return UUID_NQN_PREFIX + host_id


def valid_host_nqn(text: str) -> bool:
    return _HOST_NQN.fullmatch(text) is not None and len(text.encode()) <= MAX_NQN_BYTES


def check_host_nqn(host_nqn: str) -> None:
    """Raise ``InvalidArgument`` unless ``host_nqn`` is a valid host NQN."""
    if not valid_host_nqn(host_nqn):
        raise InvalidArgument(f"host NQN {host_nqn!r} is not a valid NQN (nqn.YYYY-MM.domain:..., <= 223 bytes)")


def node_id_for(host_nqn: str) -> str:
    """The CSI node ID of a node whose host NQN is ``host_nqn`` (the NQN itself)."""
    check_host_nqn(host_nqn)
    if len(host_nqn.encode()) > MAX_NODE_ID_BYTES:
        raise InvalidArgument(f"host NQN {host_nqn!r} is longer than a CSI node ID may be (192 bytes)")
    return host_nqn


def host_nqn_of(node_id: str) -> str:
    """The host NQN a CSI node ID stands for; ``NotFound`` when it cannot be a node of this driver."""
    if not valid_host_nqn(node_id):
        raise NotFound(f"node {node_id!r} is not a node of this driver (node IDs are host NQNs)")
    return node_id
