"""Versioned CSI volume IDs ``nvmeof-v1.<location>.<uuid>`` and snapshot IDs ``nvmeof-snap-v1.<location>.<uuid>``
(at most 128 bytes).

``location`` names the backend or target agent that holds the volume (a DNS label), so the stateless
controller can route every later call without a lookup. Decoding rejects an empty ID with INVALID_ARGUMENT
one over 128 bytes (the CSI size limit) with INVALID_ARGUMENT,
and anything else that is not an ID of ours with NOT_FOUND (no such volume can exist), as the CSI spec asks.
"""

from __future__ import annotations

import uuid

from nvmeof_csi.errors import InvalidArgument, NotFound
from nvmeof_csi.service.contracts import VolumeRef, valid_location

VERSION_PREFIX = "nvmeof-v1"
SNAPSHOT_PREFIX = "nvmeof-snap-v1"
MAX_ID_BYTES = 128


def encode(ref: VolumeRef, prefix: str = VERSION_PREFIX) -> str:
    """The ID of ``ref``; raises ``ValueError`` for a location or UUID we would not be able to decode."""
    if not valid_location(ref.location):
        raise ValueError(f"location {ref.location!r} is not a DNS label")
    canonical = str(uuid.UUID(ref.uuid))
    volume_id = f"{prefix}.{ref.location}.{canonical}"
    assert len(volume_id.encode()) <= MAX_ID_BYTES
    return volume_id


def decode(volume_id: str, prefix: str = VERSION_PREFIX, what: str = "volume") -> VolumeRef:
    """The reference inside ``volume_id``; see the module docstring for the errors."""
    if not volume_id:
        raise InvalidArgument(f"{what}_id is required")
    if len(volume_id.encode()) > MAX_ID_BYTES:
        raise InvalidArgument(f"{what}_id is {len(volume_id.encode())} bytes; the CSI limit is 128")
    version, _, rest = volume_id.partition(".")
    location, _, raw_uuid = rest.partition(".")
    if version != prefix or not valid_location(location):
        raise NotFound(f"{what} {volume_id!r} does not exist (not an ID of this driver)")
    try:
        parsed = uuid.UUID(raw_uuid)
    except ValueError as exc:
        raise NotFound(f"{what} {volume_id!r} does not exist (malformed UUID)") from exc
    if str(parsed) != raw_uuid:
        raise NotFound(f"{what} {volume_id!r} does not exist (non-canonical UUID)")
    return VolumeRef(location, raw_uuid)


def encode_snapshot(ref: VolumeRef) -> str:
    return encode(ref, SNAPSHOT_PREFIX)


def decode_snapshot(snapshot_id: str) -> VolumeRef:
    return decode(snapshot_id, SNAPSHOT_PREFIX, "snapshot")
