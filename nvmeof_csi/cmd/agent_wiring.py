"""Composition root of ``nvmeof-csi agent``: builds the target agent from :class:`AgentSettings`, converges
configfs and the pool to the saved state, then serves the agent API on a unix socket and/or TCP with mutual
TLS until SIGTERM.

Contract: the agent refuses to start on plaintext TCP unless explicitly allowed on a loopback address;
convergence happens before the first RPC is accepted; unknown objects are logged (and removed only with
``--prune``).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time

from prometheus_client import CollectorRegistry

from nvmeof_csi import DRIVER_NAME
from nvmeof_csi.agent.api import AGENT_LOCK_TABLE, AGENT_RPC_THREADS, AgentServicer
from nvmeof_csi.agent.authz import Authorizer, load_policy
from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.converge import ConvergeReport
from nvmeof_csi.agent.drbd import DrbdResources
from nvmeof_csi.agent.fence_spool import HELPER_NAME, FenceSpool, install_helper
from nvmeof_csi.agent.metrics import AgentCollector
from nvmeof_csi.agent.pool import FileStore
from nvmeof_csi.agent.readonly import KernelReadOnlyDevices, PlainReadOnlyDevices
from nvmeof_csi.agent.replica_devices import LoopLinks
from nvmeof_csi.agent.replicas import Replication
from nvmeof_csi.agent.state import StateStore
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.cmd.agent_settings import AgentSettings
from nvmeof_csi.cmd.identity_wiring import certificates_api, keeper
from nvmeof_csi.datasets.client import AlluxioRest, JobServiceLoader
from nvmeof_csi.datasets.fill import DatasetVolumes
from nvmeof_csi.datasets.holders import DatasetHolders
from nvmeof_csi.datasets.hydrate import DatasetMetrics, Hydrator
from nvmeof_csi.errors import DriverError, FailedPrecondition
from nvmeof_csi.gen import nvmeof_agent_pb2_grpc as pb_grpc
from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.keyring import NvmeKeyring
from nvmeof_csi.host.tlshd_keyring import publish_when_found
from nvmeof_csi.issuance.certificate import IdentityCertificate, agent_identity
from nvmeof_csi.issuance.checks import AGENT_SIGNER
from nvmeof_csi.rpc.background import Background
from nvmeof_csi.rpc.endpoints import TlsFiles
from nvmeof_csi.rpc.metrics import RpcMetrics, serve_metrics
from nvmeof_csi.rpc.server import bind, bind_mtls, new_threaded_server, run_until_stopped

log = logging.getLogger(__name__)


def build_datasets(settings: AgentSettings, registry: CollectorRegistry) -> DatasetVolumes | None:
    """Dataset hydration through Alluxio, when the agent is configured with one."""
    if not settings.alluxio_proxy:
        return None
    rest = AlluxioRest(settings.alluxio_proxy, settings.alluxio_job)
    hydrator = Hydrator(
        rest,
        JobServiceLoader(rest),
        Filesystems(SubprocessExecutor()),
        DatasetMetrics(registry),
        high_water=settings.pool_high_water,
    )
    return DatasetVolumes(
        hydrator,
        settings.pool_dir / ".hydrate",
        settings.dataset_ufs_allow,
        settings.dataset_root,
        holders=DatasetHolders(rest, settings.name),
    )


def build_replication(settings: AgentSettings, plain_tree: bool) -> Replication | None:
    """The replicated volumes' kernel side, with ``--replication-address``: DRBD's usermode helper pointed at
    this agent's spool (``FailedPrecondition`` when the module cannot be loaded), resource files in the state
    folder."""
    if not settings.replication_address or plain_tree:
        return None
    executor = SubprocessExecutor()
    helper_dir = settings.drbd_helper_dir
    spool = install_helper(helper_dir, executor)
    log.info("replication on %s; DRBD's helper is %s", settings.replication_address, helper_dir / HELPER_NAME)
    return Replication(
        DrbdResources(executor, settings.state_dir / "drbd"),
        LoopLinks(executor),
        os.uname().nodename,
        str(helper_dir / HELPER_NAME),
        FenceSpool(spool, lambda request: None),  # the controller answers (AnswerFenceRequest)
        address=settings.replication_address,
    )


def build_agent(
    settings: AgentSettings, plain_tree: bool = False, registry: CollectorRegistry | None = None
) -> TargetAgent:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return TargetAgent(
        name=settings.name,
        nvmet=Nvmet(settings.configfs_root, plain_tree=plain_tree, cntlid=settings.cntlid()),
        store=FileStore(settings.pool_dir),
        state=StateStore(settings.state_dir),
        portals=settings.portals,
        capacity_limit=settings.capacity_limit_bytes,
        high_water=settings.pool_high_water,
        buffered_io=settings.buffered_io,
        filler=build_datasets(settings, registry or CollectorRegistry()),
        readonly_devices=PlainReadOnlyDevices() if plain_tree else KernelReadOnlyDevices(SubprocessExecutor()),
        replication=build_replication(settings, plain_tree),
        self_fence_after=settings.self_fence_after,
    )


def start_up(agent: TargetAgent, prune: bool) -> ConvergeReport:
    """Converge, then finish the fences and key rotations a stopped agent left undone, logging each step."""
    report = agent.converge(prune=prune)
    for line in report.applied:
        log.info("converge: %s", line)
    for line in report.unknown:
        log.warning("unknown object (kept; --prune removes it): %s", line)
    for line in report.pruned:
        log.warning("pruned unknown object: %s", line)
    for line in report.problems:
        log.error("converge problem: %s", line)
    for line in agent.resume_fences():
        log.warning("finished a fence a stopped agent left undone: %s", line)
    for line in agent.finish_rotations():
        log.warning("finished a key rotation a stopped agent left half done: %s", line)
    return report


def own_tls(settings: AgentSettings, background: Background, retry: float = 5.0) -> TlsFiles:
    """The agent's own server certificate (``--identity csr``): asked of the controller's signer until issued
    (each failure logged), then kept renewed by a loop in ``background``; the server picks up a renewed one at
    its next handshake."""
    assert settings.tcp_endpoint is not None and settings.tls_ca is not None  # checked by the settings
    api = certificates_api(settings.kubeconfig)  # the client is imported when a certificate must be asked for
    cert = IdentityCertificate(
        api,
        settings.state_dir / "identity",
        AGENT_SIGNER,
        agent_identity(settings.name, settings.tcp_endpoint.host),
        datetime.timedelta(hours=settings.identity_hours),
    )
    while True:
        try:
            cert.ensure()
            break
        except (DriverError, OSError) as exc:
            log.warning("agent identity: %s; trying again in %.0fs", exc, retry)
            time.sleep(retry)
    background.add("identity", keeper(cert, lambda: None))
    return TlsFiles(cert.cert, cert.key, settings.tls_ca)


async def serve_agent(settings: AgentSettings, plain_tree: bool = False) -> None:
    registry = CollectorRegistry()
    agent = build_agent(settings, plain_tree, registry)
    if settings.metrics_listen:
        serve_metrics(settings.metrics_listen, registry)
        log.info("metrics on http://%s/metrics", settings.metrics_listen)
    if not agent.nvmet.available():
        raise FailedPrecondition(
            f"nvmet configfs is not available at {settings.configfs_root} (modprobe nvmet nvmet-tcp; mount configfs)"
        )
    report = start_up(agent, settings.prune)
    policy = load_policy(settings.authz_file) if settings.authz_file is not None else {}
    node_ca = settings.node_ca.read_bytes() if settings.node_ca is not None else None
    registry.register(AgentCollector(agent, lambda: len(report.unknown)))
    # threads, not asyncio: every agent call is blocking work, served straight on a server thread (#17)
    server = new_threaded_server(
        AGENT_LOCK_TABLE,
        Authorizer(policy, node_ca),
        RpcMetrics(registry, DRIVER_NAME).observe,
        workers=AGENT_RPC_THREADS,
    )
    pb_grpc.add_AgentServicer_to_server(AgentServicer(agent, report.unknown), server)
    sockets = []
    if settings.unix_endpoint is not None:
        bind(server, settings.unix_endpoint, socket_mode=0o600)  # owner (root) only, from the first moment
        assert settings.unix_endpoint.path is not None
        sockets.append(settings.unix_endpoint.path)
    background = Background()
    tls = own_tls(settings, background) if settings.identity == "csr" else settings.tls
    if settings.tcp_endpoint is not None:
        if tls is not None:
            bind_mtls(server, settings.tcp_endpoint, tls, extra_ca=node_ca or b"", reload=settings.identity == "csr")
        else:  # plaintext: settings allow it on a loopback address only
            bind(server, settings.tcp_endpoint)
    log.info(
        "agent %s serving (%s%s), %d volumes, portals %s",
        agent.name,
        settings.unix_endpoint or "",
        f" {settings.tcp_endpoint} (mTLS)" if tls else "",
        len(agent.list_volumes()),
        ", ".join(f"{p.trtype}:{p.traddr}:{p.trsvcid}/{p.group}" for p in agent.portals),
    )
    if agent.filler is not None:  # a fill does not watch the event: it resumes at the next start if stopped
        background.add("resume-fills", lambda _stop: agent.resume_fills())
    if settings.keyring_serial_file is not None:  # for tlshd in its own container (nvmeof-csi tlshd)
        background.add("keyring-serial", publish_when_found(settings.keyring_serial_file, NvmeKeyring()))
    if agent.replication is not None:
        background.add("self-fence", agent.self_fence.run)
    background.start()
    try:
        await run_until_stopped(server, settings.grace_seconds, sockets, socket_mode=0o600)  # owner (root) only
    finally:
        await asyncio.to_thread(background.stop, 2.0)
