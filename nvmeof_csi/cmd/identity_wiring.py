"""Node identities in ``nvmeof-csi serve``: the controller's signer (``--node-signer-ca``) and a node's own
certificate (``--node-identity csr``), each run in a daemon thread.

Contract: :func:`start_signer` returns the running signer, or ``None`` without ``--node-signer-ca``; it raises
``ConfigError`` when the signer is asked for but the Kubernetes API cannot be reached. :func:`start_node_identity`
makes the node's agent clients use its own certificate and keeps that certificate issued and renewed: a failure
is logged and tried again every ``retry`` seconds (calls to agents meanwhile fail with UNAVAILABLE, naming it).
"""

from __future__ import annotations

import datetime
import importlib
import logging
import threading

from nvmeof_csi.backends.agent_limits import AgentClients
from nvmeof_csi.backends.kube_nodes import KubeNodes, api_client
from nvmeof_csi.backends.node_certificate import NodeCertificate
from nvmeof_csi.backends.node_signer import NodeSigner, Policy
from nvmeof_csi.cmd.settings import Settings
from nvmeof_csi.errors import ConfigError, DriverError
from nvmeof_csi.service.fencing import NodeFacts

log = logging.getLogger(__name__)


def _certificates_api(kubeconfig: str) -> object:
    return importlib.import_module("kubernetes.client").CertificatesV1Api(api_client(kubeconfig))


def start_signer(settings: Settings, facts: NodeFacts) -> NodeSigner | None:
    folder = settings.node_signer_ca
    if folder is None:
        return None
    if not isinstance(facts, KubeNodes):
        raise ConfigError(
            "--node-signer-ca needs the Kubernetes API (the controller's service account or --kubeconfig)"
        )
    ca = ((folder / "tls.crt").read_bytes(), (folder / "tls.key").read_bytes())
    lifetime = datetime.timedelta(hours=settings.node_identity_hours)
    signer = NodeSigner(
        _certificates_api(settings.kubeconfig), facts.claimed_by, ca, Policy(settings.node_signer_requester, lifetime)
    )
    signer.start()
    log.info("node identity signer running for %s (certificates for %s)", settings.node_signer_requester, lifetime)
    return signer


def start_node_identity(
    settings: Settings, host_nqn: str, clients: AgentClients, every: float = 600.0, retry: float = 15.0
) -> NodeCertificate | None:
    if settings.node_identity != "csr":
        return None
    cert = NodeCertificate(
        _certificates_api(settings.kubeconfig),
        settings.state_dir / "node" / "identity",
        settings.node_name,
        host_nqn,
        datetime.timedelta(hours=settings.node_identity_hours),
    )
    clients.use_identity(cert.cert, cert.key)
    threading.Thread(target=_keep, args=(cert, clients, every, retry), name="node-identity", daemon=True).start()
    return cert


def _keep(cert: NodeCertificate, clients: AgentClients, every: float, retry: float) -> None:
    stop = threading.Event()  # never set: the thread lives as long as the process
    while True:
        try:
            if cert.ensure():
                clients.reset()
                log.info("node identity issued and in use (%s)", cert.cert)
            wait = every
        except (DriverError, OSError) as exc:
            log.warning("node identity: %s; trying again in %.0fs", exc, retry)
            wait = retry
        stop.wait(wait)


__all__ = ["start_node_identity", "start_signer"]
