"""Node IDs are host NQNs — defined once, here.

A node plugin's NodeGetInfo returns its host NQN (``nqn.2014-08.org.nvmexpress:uuid:<host-id>``, unique per
node, generated and persisted when missing) as the CSI node ID. ControllerPublishVolume therefore knows, from
the node ID alone and without any state, which host to allow on the volume's subsystem. A node ID that is not
a valid NQN cannot belong to a node of this driver: NOT_FOUND.
"""

from __future__ import annotations

import re

from nvmeof_csi.errors import InvalidArgument, NotFound

_NQN = re.compile(r"^nqn\.\d{4}-\d{2}\.[^\s/]{1,215}$")
MAX_NODE_ID_BYTES = 192  # CSI limit; NQNs may be 223 bytes, ours are ~68


def valid_host_nqn(text: str) -> bool:
    return bool(_NQN.match(text)) and len(text.encode()) <= 223


def check_host_nqn(host_nqn: str) -> None:
    if not valid_host_nqn(host_nqn):
        raise InvalidArgument(f"host NQN {host_nqn!r} is not a valid NQN (nqn.YYYY-MM.domain:..., <= 223 bytes)")


def node_id_for(host_nqn: str) -> str:
    check_host_nqn(host_nqn)
    if len(host_nqn.encode()) > MAX_NODE_ID_BYTES:
        raise InvalidArgument(f"host NQN {host_nqn!r} is longer than a CSI node ID may be (192 bytes)")
    return host_nqn


def host_nqn_of(node_id: str) -> str:
    if not valid_host_nqn(node_id):
        raise NotFound(f"node {node_id!r} is not a node of this driver (node IDs are host NQNs)")
    return node_id


class HostNqnNodes:
    """NodeDirectory for the NVMe-oF backend: every node ID that is a host NQN may be published to."""

    def knows(self, node_id: str) -> bool:
        return valid_host_nqn(node_id)
