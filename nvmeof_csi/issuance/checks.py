"""What the controller's identity signer checks before it issues (``issuance/signer.py``): one function per
signerName, each returning the checked request and its lifetime or raising :class:`Refused` naming the first
fact that fails.

Both kinds share the requester facts: the request was made by the expected service account with a pod-bound
token whose node claim (``authentication.kubernetes.io/node-name``, set by the API server) names one node, and
the usages are the kind's only. Then:

- **node** (:data:`NODE_SIGNER`, :func:`check_node`): CN ``node:<that node>``, exactly one URI (the host NQN)
  and no IP, the NQN is this driver's node ID in that node's CSINode and in no other's (read at that moment,
  never from a cache), and the NQN is not bound to another node while a certificate of it may live: the
  durable binding (``kube/bindings.py``) is made before the certificate is issued, and never moved while it
  lasts;
- **agent** (:data:`AGENT_SIGNER`, :func:`check_agent`): CN ``agent:<name>`` of an agent in the fabric map,
  exactly one IP and no URI, the IP is that agent's endpoint address in the map and the requesting node is the
  Node the map names for that agent (``node:``): a storage node can get only the identity of the agent it
  hosts. Both facts come from the operator's map and the API server's token claim, never from what a node
  writes about itself (a Node's ``status.addresses`` is its kubelet's word).
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.identity.certs import AGENT_PREFIX, NODE_PREFIX, Request, read_request

NODE_SIGNER = "csi.nvmeof.io/node-client"
AGENT_SIGNER = "csi.nvmeof.io/agent-server"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
MIN_LIFETIME = datetime.timedelta(minutes=10)
_BASE_USAGES = frozenset({"digital signature", "key encipherment"})


class Refused(Exception):
    """Why a request is denied (its message is the Denied condition's message)."""


@dataclass(frozen=True)
class Policy:
    """Who may ask (a service account user name) and for how long at most."""

    requester: str
    lifetime: datetime.timedelta


def _requested(spec: Any, policy: Policy, usage: str, who: str) -> tuple[str, Request, datetime.timedelta]:
    """(requesting node, request, lifetime) once the facts every kind shares hold."""
    if spec.username != policy.requester:
        raise Refused(f"requested by {spec.username!r}, not the {who} ({policy.requester})")
    nodes = (spec.extra or {}).get(NODE_CLAIM) or []
    if len(nodes) != 1:
        raise Refused("the requester's token names no node (a pod-bound service account token is needed)")
    usages = set(spec.usages or [])
    if usage not in usages or usages - _BASE_USAGES - {usage}:
        raise Refused(f"usages {sorted(usages)}: this identity is for {usage} only")
    try:
        request = read_request(base64.b64decode(spec.request))
    except (InvalidArgument, ValueError) as exc:
        raise Refused(f"malformed request: {exc}") from exc
    lifetime = policy.lifetime
    if spec.expiration_seconds:
        lifetime = min(lifetime, max(MIN_LIFETIME, datetime.timedelta(seconds=int(spec.expiration_seconds))))
    return str(nodes[0]), request, lifetime


#: (host NQN, node, lifetime) -> "" once the NQN is bound to the node for that long, else why it is not
Bind = Callable[[str, str, datetime.timedelta], str]


def check_node(
    spec: Any, policy: Policy, claimed_by: Callable[[str], list[str]], bind: Bind
) -> tuple[Request, datetime.timedelta]:
    """A GPU node's client identity; ``claimed_by``: the Nodes whose CSINode reports a node ID, read now."""
    node, request, lifetime = _requested(spec, policy, "client auth", "node plugin")
    if request.common_name != NODE_PREFIX + node:
        raise Refused(f"asks for {request.common_name!r} but its requester runs on node {node!r}")
    if len(request.uris) != 1 or request.ips:
        raise Refused("a node identity names exactly one host NQN (one URI) and no IP address")
    claimants = claimed_by(request.uris[0])
    if claimants != [node]:
        raise Refused(f"host NQN {request.uris[0][:230]!r} is the node ID of {claimants or 'no node'}, not {node!r}")
    if why := bind(request.uris[0], node, lifetime):
        raise Refused(why)
    return request, lifetime


def check_agent(
    spec: Any, policy: Policy, agent_of: Callable[[str], tuple[str, str] | None]
) -> tuple[Request, datetime.timedelta]:
    """A storage node's agent server identity; ``agent_of``: an agent's (endpoint IP address, Node name) in the
    fabric map (``None``: not in it, or its endpoint is no IP address; ``""``: the map names no node)."""
    node, request, lifetime = _requested(spec, policy, "server auth", "agent")
    name = request.common_name.removeprefix(AGENT_PREFIX)
    if not request.common_name.startswith(AGENT_PREFIX) or request.uris or len(request.ips) != 1:
        raise Refused("an agent identity is CN agent:<name> with exactly one IP address and no URI")
    entry = agent_of(name)
    if entry is None:
        raise Refused(f"agent {name[:100]!r} is not in the controller's fabric map with an IP address endpoint")
    address, host = entry
    if request.ips[0] != address:
        raise Refused(f"asks for {request.ips[0]} but agent {name!r} serves on {address} in the fabric map")
    if not host:
        raise Refused(f"agent {name!r} names no node in the fabric map (node:): nobody may get its identity")
    if host != node:
        raise Refused(f"agent {name!r} runs on node {host!r} in the fabric map, not on the requesting node {node!r}")
    return request, lifetime
