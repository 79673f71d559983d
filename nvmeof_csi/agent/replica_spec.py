"""What one replica of a replicated volume (``replicas: "2"``) knows of its pair, as the agent saves it with the
volume's record (``VolumeRecord.replica``, a flat string map) and the controller sends it in ``CreateVolume``.

Both agents of a pair hold the same volume UUID (so the same subsystem NQN, namespace UUID, NGUID and serial: one
NVMe identity on two nodes), the same DRBD minor and replication port, and the same shared secret; each names
the other as its peer. The backing device is the same path on both nodes (:func:`disk_path`): a link the agent
keeps to the loop device over the volume's file, so the one resource file both sides write agrees.

Contract: :meth:`ReplicaSpec.parse` takes the map from a request or a saved record and raises ``InvalidArgument``
naming the field for anything out of shape (a host that is not a host name, an address that is not an IP
literal, a minor or port out of range, a secret that is not 32-64 lowercase hex digits, an unknown role or
key); :meth:`ReplicaSpec.to_map` is its inverse. The secret is in the map: records are owner-only files, and
nothing here logs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from nvmeof_csi.agent.drbd_config import MAX_MINOR, DrbdSide
from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.nqn import check_uuid
from nvmeof_csi.service.contracts import valid_node_name

PRIMARY, SECONDARY, FENCED, HANDOVER = "primary", "secondary", "fenced", "handover"
ROLES = (PRIMARY, SECONDARY, FENCED, HANDOVER)  # what each means: ``agent/replicas.py``
DISCARD = "discard"  # not a role: secondary, reconnecting with DRBD's --discard-my-data (the controller's call)
ACTIONS = (*ROLES, DISCARD)  # what SetReplicaRole takes
DISK_DIR = "/dev/nvmeof-csi"
_SECRET = re.compile(r"[0-9a-f]{32,64}")
_KEYS = frozenset({"peer_agent", "peer_host", "peer_address", "address", "port", "minor", "secret", "role", "epoch"})


def disk_path(vol_uuid: str) -> str:
    """The backing device's path in the resource file: the same on both nodes (a link to this node's loop)."""
    return f"{DISK_DIR}/replica-{check_uuid(vol_uuid, 'volume UUID')}"


@dataclass(frozen=True)
class ReplicaSpec:
    """This replica's pair: the peer agent's name, the peer node's host name (``uname -n``) and replication
    address, this node's replication address, the shared port and minor, the secret, the role the controller
    last gave this replica and the epoch it gave it in."""

    peer_agent: str
    peer_host: str
    peer_address: str
    address: str
    port: int
    minor: int
    secret: str = field(repr=False)  # never in a log line or an error that prints the spec
    role: str = SECONDARY
    epoch: int = 0

    @classmethod
    def parse(cls, doc: Mapping[str, str]) -> ReplicaSpec:
        unknown = sorted(set(doc) - _KEYS)
        if unknown:
            raise InvalidArgument(f"replica has unknown field(s) {', '.join(k[:40] for k in unknown[:5])}")
        missing = sorted(k for k in _KEYS - {"role", "epoch"} if not doc.get(k))
        if missing:
            raise InvalidArgument(f"replica.{missing[0]} is required")
        spec = cls(
            peer_agent=doc["peer_agent"],
            peer_host=doc["peer_host"],
            peer_address=_ip(doc["peer_address"], "replica.peer_address"),
            address=_ip(doc["address"], "replica.address"),
            port=_int(doc["port"], "replica.port", 1, 65535),
            minor=_int(doc["minor"], "replica.minor", 0, MAX_MINOR),
            secret=doc["secret"],
            role=doc.get("role") or SECONDARY,
            epoch=_int(doc.get("epoch") or "0", "replica.epoch", 0, 1 << 62),
        )
        if not valid_node_name(spec.peer_agent) or not valid_node_name(spec.peer_host):
            raise InvalidArgument("replica.peer_agent and replica.peer_host must be host names")
        if not _SECRET.fullmatch(spec.secret):
            raise InvalidArgument("replica.secret must be 32-64 lowercase hex digits")
        if spec.role not in ROLES:
            raise InvalidArgument(f"replica.role {spec.role[:20]!r} must be one of {', '.join(ROLES)}")
        return spec

    def to_map(self) -> dict[str, str]:
        return {
            "peer_agent": self.peer_agent,
            "peer_host": self.peer_host,
            "peer_address": self.peer_address,
            "address": self.address,
            "port": str(self.port),
            "minor": str(self.minor),
            "secret": self.secret,
            "role": self.role,
            "epoch": str(self.epoch),
        }

    def same_pair(self, other: ReplicaSpec) -> bool:
        """Whether ``other`` describes the same pair (role and epoch aside): a repeated create."""
        return replace(other, role=self.role, epoch=self.epoch) == self

    def sides(self, vol_uuid: str, host: str) -> tuple[DrbdSide, DrbdSide]:
        """(this node's side, the peer's side) for the resource file; ``host`` is this node's ``uname -n``."""
        disk = disk_path(vol_uuid)
        return DrbdSide(host, self.address, self.port, disk), DrbdSide(
            self.peer_host, self.peer_address, self.port, disk
        )


def _ip(value: str, field: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError as exc:
        raise InvalidArgument(f"{field} {value[:60]!r} must be an IP address") from exc


def _int(value: str, field: str, low: int, high: int) -> int:
    if not value.isdigit() or not low <= int(value) <= high:
        raise InvalidArgument(f"{field} {value[:30]!r} must be a whole number {low}-{high}")
    return int(value)


__all__ = [
    "ACTIONS", "DISCARD", "DISK_DIR", "FENCED", "HANDOVER", "PRIMARY", "ROLES", "SECONDARY", "ReplicaSpec", "disk_path",
]  # fmt: skip
