"""Identities in ``nvmeof-csi serve`` and ``nvmeof-csi agent``: the controller's signer (``--node-signer-ca``),
a GPU node's own client certificate (``--node-identity csr``) and an agent's own server certificate (the
agent's ``--identity csr``). These build; each adds its loop to the process's :class:`Background`, which the
server starts and stops.

Contract: :func:`build_signer` returns the signer (its loop added), or ``None`` without ``--node-signer-ca``; it
raises ``ConfigError`` when the signer is asked for but the Kubernetes API cannot be reached.
:func:`build_node_identity` makes the node's agent clients use its own certificate and adds the loop that keeps
it issued and renewed: a failure is logged and tried again every ``retry`` seconds (calls to agents meanwhile
fail with UNAVAILABLE, naming it).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import threading
import uuid
from collections.abc import Callable

from nvmeof_csi.agentclient.limits import AgentClients
from nvmeof_csi.cmd.settings import Settings
from nvmeof_csi.errors import ConfigError, DriverError
from nvmeof_csi.issuance.certificate import IdentityCertificate, node_identity
from nvmeof_csi.issuance.checks import AGENT_SIGNER, NODE_SIGNER, Policy, check_agent, check_node
from nvmeof_csi.issuance.signer import IdentitySigner
from nvmeof_csi.kube.api import LazyApi, lazy_api, preflight
from nvmeof_csi.kube.bindings import parse_location
from nvmeof_csi.kube.lease import LeaseElector
from nvmeof_csi.kube.nodes import KubeNodes
from nvmeof_csi.rpc.background import Background, Loop
from nvmeof_csi.service.fencing import NodeFacts
from nvmeof_csi.topology.fabric_map import load_fabric_map

log = logging.getLogger(__name__)
SIGNER_LEASE = "nvmeof-csi-identity-signer"  # the Lease whose holder is the one replica that signs


def certificates_api(kubeconfig: str) -> LazyApi:
    """The CertificatesV1Api, made at its first use; a kubeconfig or service account that cannot be read is a
    ``ConfigError`` now (:func:`~nvmeof_csi.kube.api.preflight`)."""
    try:
        preflight(kubeconfig)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the Kubernetes API for identities: {type(exc).__name__}: {exc}"[:300]) from exc
    return lazy_api(kubeconfig, "CertificatesV1Api")


def build_signer(settings: Settings, facts: NodeFacts, background: Background) -> IdentitySigner | None:
    folder = settings.node_signer_ca
    if folder is None:
        return None
    if not isinstance(facts, KubeNodes) or settings.fabric_map is None:
        raise ConfigError(
            "--node-signer-ca needs the Kubernetes API (the controller's service account or --kubeconfig) and "
            "--fabric-map"
        )
    ca = ((folder / "tls.crt").read_bytes(), (folder / "tls.key").read_bytes())
    lifetime = datetime.timedelta(hours=settings.node_identity_hours)
    fabric = load_fabric_map(settings.fabric_map)

    def agent_of(name: str) -> tuple[str, str] | None:
        """The agent's endpoint IP and Node in the map (an identity names an IP address; a DNS endpoint has
        none)."""
        entry = fabric.agent(name)
        try:
            return (str(ipaddress.ip_address(entry.endpoint.host)), entry.node) if entry is not None else None
        except ValueError:
            return None

    namespace, name = parse_location(settings.identity_bindings)
    bindings = facts.bind_identities(namespace, name)
    elector = LeaseElector(
        lazy_api(settings.kubeconfig, "CoordinationV1Api"),
        namespace,
        SIGNER_LEASE,
        f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
    )

    def bind(nqn: str, node: str, lifetime: datetime.timedelta) -> str:
        now = datetime.datetime.now(datetime.UTC)
        return bindings.bind(nqn, node, now + lifetime, now)

    def claimed_now(nqn: str) -> list[str]:
        return facts.claimed_by(nqn, fresh=True)

    node_policy = Policy(settings.node_signer_requester, lifetime)
    checks = {NODE_SIGNER: lambda spec: check_node(spec, node_policy, claimed_now, bind)}
    if settings.agent_signer_requester:
        agent_policy = Policy(settings.agent_signer_requester, lifetime)
        checks[AGENT_SIGNER] = lambda spec: check_agent(spec, agent_policy, agent_of)
    signer = IdentitySigner(certificates_api(settings.kubeconfig), checks, ca, leader=elector.lead)

    def sign(stop: threading.Event) -> None:  # a clean stop hands the Lease on at once
        try:
            signer.run(stop)
        finally:
            elector.release()

    background.add("identity-signer", sign)
    log.info("identity signer for %s (certificates for %s)", ", ".join(checks), lifetime)
    return signer


def build_node_identity(
    settings: Settings,
    host_nqn: str,
    clients: AgentClients,
    background: Background,
    every: float = 600.0,
    retry: float = 15.0,
) -> IdentityCertificate | None:
    if settings.node_identity != "csr":
        return None
    cert = IdentityCertificate(
        certificates_api(settings.kubeconfig),
        settings.state_dir / "node" / "identity",
        NODE_SIGNER,
        node_identity(settings.node_name, host_nqn),
        datetime.timedelta(hours=settings.node_identity_hours),
    )
    clients.use_identity(cert.cert, cert.key)
    background.add("identity", keeper(cert, clients.reset, every, retry))
    return cert


def keeper(cert: IdentityCertificate, renewed: Callable[[], None], every: float = 600.0, retry: float = 15.0) -> Loop:
    """The loop that keeps ``cert`` issued and renewed until stopped; ``renewed`` runs after each new one."""

    def keep(stop: threading.Event) -> None:
        while True:
            try:
                if cert.ensure():
                    renewed()
                    log.info("identity issued and in use (%s)", cert.cert)
                wait = every
            except (DriverError, OSError) as exc:
                log.warning("identity: %s; trying again in %.0fs", exc, retry)
                wait = retry
            if stop.wait(wait):
                return

    return keep


__all__ = ["build_node_identity", "build_signer", "certificates_api", "keeper"]
