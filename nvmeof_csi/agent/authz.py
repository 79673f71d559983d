"""Who may call which agent RPC.

A client on TCP proves its identity with its certificate (mutual TLS); the agent's policy file maps that
identity (the certificate's common name, or one of its DNS/URI subject alternative names) to one role:

    clients:
      - {identity: controller.nvmeof-csi, role: controller}
      - {identity: gpu-node-1, role: node, hostNqn: "nqn.2014-08.org.nvmexpress:uuid:..."}
      - {identity: ops, role: admin}
      - {identity: prometheus, role: reader}

| role | may call |
|---|---|
| ``reader`` | Health, GetVolume, ListVolumes, ListSnapshots, ListPortals, GetCapacity, LookupName, ListFenceRequests |
| ``node`` | Health, and GetVolume / ListVolumes / GetHostKeys of the volumes that allow its own ``hostNqn`` only |

A node identity the node CA issued also names its Kubernetes Node (CN ``node:<name>``): on a volume whose grant
recorded the host's Node (AllowHost ``node_name``, from the controller), it must be that Node, or the volume is
not its own (a host NQN whose identity was issued to another Node after the first one's expired gets nothing).
| ``controller`` | a reader's calls, and every change of volumes, replica roles, snapshots, grants, reservations |
| ``admin`` | everything, also SetAnaState |

A client whose certificate the **node CA** directly issued (``--node-ca``: the CA of the controller's node
identity signer, ``issuance/signer.py``) is role ``node`` with the host NQN its certificate names
(:func:`~nvmeof_csi.identity.certs.node_identity_of`), without a policy entry; a certificate of the node CA
that is no node identity is refused, and none is ever any other role whatever names it carries.

Contract: :meth:`Authorizer.authorize` raises ``PermissionDenied`` naming the role the call needs and the
caller's identity; an identity the policy does not know is refused whatever it asks. Callers without TLS
(the owner-only unix socket, or plaintext TCP explicitly allowed on loopback for tests) are the local admin.
The caller of the current RPC is available to the servicer through :func:`caller` (a contextvar).
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nvmeof_csi.errors import ConfigError, PermissionDenied
from nvmeof_csi.identity.certs import issued_by, node_identity_of
from nvmeof_csi.nvmeof.nqn import valid_host_nqn
from nvmeof_csi.rpc.edge import Context

READER, NODE, CONTROLLER, ADMIN = "reader", "node", "controller", "admin"
ROLES = (READER, NODE, CONTROLLER, ADMIN)
_READ = {
    "Health",
    "GetVolume",
    "ListVolumes",
    "ListSnapshots",
    "ListPortals",
    "GetCapacity",
    "LookupName",
    "ListFenceRequests",
}
_WRITE = {
    "CreateVolume",
    "DeleteVolume",
    "ResizeVolume",
    "ModifyVolume",
    "SetReplicaRole",
    "AnswerFenceRequest",
    "CreateSnapshot",
    "DeleteSnapshot",
    "AllowHost",
    "DenyHost",
    "FenceHost",
    "UnfenceHost",
    "ReserveName",
    "ReleaseName",
}
ALLOWED: Mapping[str, frozenset[str]] = {
    READER: frozenset(_READ),
    NODE: frozenset({"Health", "GetVolume", "ListVolumes", "GetHostKeys"}),
    CONTROLLER: frozenset(_READ | _WRITE),
}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its identity, role and (role ``node``) host NQN; a node identity the node CA
    issued names its Kubernetes Node too (``node``; ``""`` for a policy entry, which the operator assigned)."""

    identity: str
    role: str
    host_nqn: str = ""
    node: str = ""

    def holds(self, host_nqn: str, host_nodes: Mapping[str, str]) -> bool:
        """Whether this node principal is the grant of ``host_nqn`` (``host_nodes``: a volume's host -> Node):
        its own NQN, and the Node the grant recorded, if both name one."""
        granted = host_nodes.get(host_nqn, "")
        return host_nqn == self.host_nqn and (not granted or not self.node or granted == self.node)


LOCAL_ADMIN = Principal("local", ADMIN)
_CALLER: contextvars.ContextVar[Principal] = contextvars.ContextVar("agent_caller", default=LOCAL_ADMIN)


def caller() -> Principal:
    """The principal of the RPC being served (the local admin outside any RPC)."""
    return _CALLER.get()


def needed_role(method: str) -> str:
    """The least role that may call ``method`` (its short name)."""
    return next((r for r in (READER, CONTROLLER, NODE) if method in ALLOWED[r]), ADMIN)


def parse_policy(doc: Any, where: str = "authz policy") -> dict[str, Principal]:
    """identity -> principal; ``ConfigError`` naming the entry for anything malformed."""
    if not isinstance(doc, dict) or not isinstance(doc.get("clients"), list):
        raise ConfigError(f"{where} needs a 'clients:' list")
    found: dict[str, Principal] = {}
    for index, entry in enumerate(doc["clients"]):
        at = f"{where} clients[{index}]"
        if not isinstance(entry, dict) or set(entry) - {"identity", "role", "hostNqn"}:
            raise ConfigError(f"{at} must be a mapping of identity, role and (for nodes) hostNqn")
        identity, role, host = entry.get("identity"), entry.get("role"), entry.get("hostNqn", "")
        if not isinstance(identity, str) or not identity or identity in found:
            raise ConfigError(f"{at}: identity must be a unique, non-empty string")
        if role not in ROLES:
            raise ConfigError(f"{at}: role must be one of {', '.join(ROLES)}")
        if not isinstance(host, str) or (role == NODE) != bool(host) or (host and not valid_host_nqn(host)):
            raise ConfigError(f"{at}: hostNqn (a valid NQN) is required for role node, and only for it")
        found[identity] = Principal(identity, str(role), host)
    return found


def load_policy(path: Path) -> dict[str, Principal]:
    try:
        return parse_policy(yaml.safe_load(path.read_text()), f"authz policy {path}")
    except OSError as exc:
        raise ConfigError(f"authz policy {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"authz policy {path} is not valid YAML: {exc}") from exc


def _identities(context: Context) -> tuple[list[str], bytes] | None:
    """The certificate identities of a TLS caller (CN first) and its certificate (PEM), or ``None`` for a caller
    without TLS."""
    auth = context.auth_context() or {}
    if b"ssl" not in auth.get("transport_security_type", []):
        return None
    names = [*auth.get("x509_common_name", []), *auth.get("x509_subject_alternative_name", [])]
    pem = auth.get("x509_pem_cert", [])
    return [n.decode(errors="replace") for n in names], pem if isinstance(pem, bytes) else b"".join(pem)


class Authorizer:
    """The agent's ``rpc.edge.Authorize`` hook over a policy (identity -> principal) and, with ``node_ca``
    (PEM), the node identities that CA issued."""

    def __init__(self, policy: Mapping[str, Principal], node_ca: bytes | None = None) -> None:
        self._policy = dict(policy)
        self._node_ca = node_ca

    def _principal(self, identities: list[str], pem: bytes) -> Principal | None:
        if self._node_ca is not None and pem and issued_by(pem, self._node_ca):
            node = node_identity_of(pem)
            if node is None:
                raise PermissionDenied("a certificate of the node CA that is not a node identity is refused")
            return Principal(f"node:{node[0]}", NODE, node[1], node[0])
        return next((self._policy[i] for i in identities if i in self._policy), None)

    def __call__(self, method: str, context: Context) -> None:
        short = method.rsplit("/", 1)[-1]
        peer = _identities(context)
        if peer is None:
            _CALLER.set(LOCAL_ADMIN)
            return
        identities, pem = peer
        principal = self._principal(identities, pem)
        if principal is None:
            raise PermissionDenied(
                f"client {identities[0] if identities else '?'!r} is not in this agent's "
                f"authz policy; {short} needs role {needed_role(short)}"
            )
        if principal.role != ADMIN and short not in ALLOWED[principal.role]:
            raise PermissionDenied(
                f"{short} needs role {needed_role(short)}; client {principal.identity!r} has role {principal.role}"
            )
        _CALLER.set(principal)
