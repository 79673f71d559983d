"""The DRBD 8.4 resource of a replicated volume (the kernel's in-tree DRBD, driven by drbd-utils' ``drbdadm-84``),
as the file each of its two agents writes: protocol C (a write is acknowledged once both disks have it), the
controller as the arbiter of who may go on when the replication link breaks (``fencing
resource-and-stonith``: I/O freezes and the ``fence-peer`` handler asks the controller), and no automatic
split-brain recovery (every ``after-sb-*`` policy disconnects: the controller directs the resolution).

Contract: :func:`resource_text` renders one resource from checked values only: the resource name from the
volume UUID (:func:`resource_name`), each side's host name (``uname -n`` of that node: DRBD picks its own
``on`` section by it) as a DNS name, its replication address as an IP literal and port, its backing block device
as a path under ``/dev``, one minor for both sides, handler commands as absolute paths, and the per-volume
shared secret (peer authentication, ``cram-hmac-alg sha256``) as hex. Anything else raises ``InvalidArgument``
naming the field. The text holds the secret: write it owner-only, never log it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.nqn import check_uuid
from nvmeof_csi.service.contracts import valid_node_name

MAX_MINOR = (1 << 20) - 1
_DEVICE = re.compile(r"/dev/[A-Za-z0-9][A-Za-z0-9/_.-]{0,100}")
_COMMAND = re.compile(r"/[A-Za-z0-9][A-Za-z0-9/_.-]{0,200}")
_SECRET = re.compile(r"[0-9a-f]{32,64}")


@dataclass(frozen=True)
class DrbdSide:
    """One replica's node: its host name (``uname -n``), replication address and port, backing block device."""

    host: str
    address: str
    port: int
    disk: str


def resource_name(vol_uuid: str) -> str:
    """The DRBD resource of a volume: ``nv-`` and its UUID."""
    return "nv-" + check_uuid(vol_uuid, "volume UUID")


def _side(side: DrbdSide, which: str, minor: int) -> str:
    if not valid_node_name(side.host):
        raise InvalidArgument(f"{which} host {side.host[:80]!r} must be a host name (uname -n)")
    try:
        ip = ipaddress.ip_address(side.address)
    except ValueError as exc:
        raise InvalidArgument(f"{which} address {side.address[:80]!r} must be an IP address") from exc
    if not 1 <= side.port <= 65535:
        raise InvalidArgument(f"{which} port {side.port} must be 1-65535")
    if not _DEVICE.fullmatch(side.disk) or ".." in side.disk.split("/"):
        raise InvalidArgument(f"{which} disk {side.disk[:80]!r} must be a block device path under /dev")
    family, shown = ("ipv4", str(ip)) if ip.version == 4 else ("ipv6", f"[{ip}]")
    return (
        f"  on {side.host} {{\n"
        f"    device /dev/drbd{minor} minor {minor};\n"
        f"    disk {side.disk};\n"
        f"    address {family} {shown}:{side.port};\n"
        "    meta-disk internal;\n"
        "  }\n"
    )


def resource_text(
    vol_uuid: str, minor: int, sides: tuple[DrbdSide, DrbdSide], secret: str, fence_peer: str, after_resync: str
) -> str:
    """The resource file's text (see the module's contract)."""
    if not 0 <= minor <= MAX_MINOR:
        raise InvalidArgument(f"DRBD minor {minor} must be 0-{MAX_MINOR}")
    if sides[0].host == sides[1].host:
        raise InvalidArgument(f"both replicas are on host {sides[0].host!r}: they must be on two nodes")
    if not _SECRET.fullmatch(secret):
        raise InvalidArgument("the replication secret must be 32-64 lowercase hex digits")
    for name, command in (("fence-peer", fence_peer), ("after-resync-target", after_resync)):
        if not _COMMAND.fullmatch(command) or ".." in command.split("/"):
            raise InvalidArgument(f"{name} handler {command[:80]!r} must be an absolute path")
    return (
        f"resource {resource_name(vol_uuid)} {{\n"
        "  net {\n"
        "    protocol C;\n"
        "    cram-hmac-alg sha256;\n"
        f'    shared-secret "{secret}";\n'
        "    after-sb-0pri disconnect;\n"
        "    after-sb-1pri disconnect;\n"
        "    after-sb-2pri disconnect;\n"
        "  }\n"
        "  disk {\n"
        "    fencing resource-and-stonith;\n"
        "  }\n"
        "  handlers {\n"
        f'    fence-peer "{fence_peer}";\n'
        f'    after-resync-target "{after_resync}";\n'
        "  }\n"
        f"{_side(sides[0], 'first', minor)}"
        f"{_side(sides[1], 'second', minor)}"
        "}\n"
    )
