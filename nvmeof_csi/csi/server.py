"""The CSI gRPC server: registers the servicers this process runs, reconciles the node, serves until stopped.

Contract: :func:`serve` binds the endpoint (see ``nvmeof_csi.rpc.server`` for socket handling), runs the
node's start-up reconciliation before the first RPC, and stops gracefully on SIGTERM (or ``stop``). With a
``registration`` it also registers with kubelet (``csi/registration.py``) once the CSI socket serves, and with
``health_listen`` it answers ``GET /healthz`` from the same checks as Probe (``csi/health.py``). With
``services.workers`` the calls' blocking work (``rpc.calls.blocking``) runs on a pool of that many threads.
``services.background`` (the loops the wiring built) starts once the node is reconciled and stops last.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry

from nvmeof_csi.csi.controller import ControllerServicer
from nvmeof_csi.csi.health import serve_health
from nvmeof_csi.csi.identity import IdentityServicer
from nvmeof_csi.csi.locks import CSI_LOCK_TABLE
from nvmeof_csi.csi.node import NodeServicer
from nvmeof_csi.csi.registration import KubeletRegistration
from nvmeof_csi.gen import csi_pb2_grpc
from nvmeof_csi.rpc.background import Background
from nvmeof_csi.rpc.edge import Observe
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.rpc.server import bind, new_server, run_until_stopped
from nvmeof_csi.service.contracts import Health
from nvmeof_csi.service.provisioning import VolumeService
from nvmeof_csi.service.staging import StagingService

log = logging.getLogger(__name__)
RECONCILE_TIMEOUT = 60.0


@dataclass
class CsiServices:
    """What the servicers need; ``volumes``/``staging`` are ``None`` for a side that does not run here."""

    volumes: VolumeService | None = None
    staging: StagingService | None = None
    topology: dict[str, str] = field(default_factory=dict)
    node_id: str = ""
    max_volumes_per_node: int = 0
    checks: list[Callable[[], Health]] = field(default_factory=list)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)  # what --metrics-listen exposes
    observe: Observe | None = None  # every RPC's method, code and duration (csi_plugin_operations_seconds)
    qos_period: float = 5.0  # seconds between the node's passes over published pods' io.max
    workers: int = 0  # threads for the calls' blocking work (0: asyncio's default executor, CPUs + 4, at most 32)
    background: Background = field(default_factory=Background)  # loops started and stopped by :func:`serve`


def build_server(services: CsiServices) -> grpc.aio.Server:
    """Identity always; Controller when ``services.volumes`` is set; Node when ``services.staging`` is."""
    server = new_server(CSI_LOCK_TABLE, observe=services.observe)
    csi_pb2_grpc.add_IdentityServicer_to_server(
        IdentityServicer(controller=services.volumes is not None, checks=services.checks), server
    )
    if services.volumes is not None:
        csi_pb2_grpc.add_ControllerServicer_to_server(ControllerServicer(services.volumes), server)
    if services.staging is not None:
        csi_pb2_grpc.add_NodeServicer_to_server(
            NodeServicer(services.staging, services.node_id, services.max_volumes_per_node, services.topology),
            server,
        )
    return server


async def serve(
    services: CsiServices,
    endpoint: Endpoint,
    grace_seconds: float,
    stop: asyncio.Event | None = None,
    registration: KubeletRegistration | None = None,
    health_listen: str = "",
) -> None:
    """Serve CSI on ``endpoint`` until a signal (or ``stop``), then stop gracefully and remove the socket."""
    stop = stop or asyncio.Event()
    if services.workers:  # the pool ``rpc.calls.blocking`` runs on; asyncio.run shuts it down at the end
        pool = ThreadPoolExecutor(max_workers=services.workers, thread_name_prefix="csi-work")
        asyncio.get_running_loop().set_default_executor(pool)
    server = build_server(services)
    bind(server, endpoint)
    if services.staging is not None:
        for action in await asyncio.to_thread(services.staging.reconcile, RECONCILE_TIMEOUT):
            log.info("reconcile: %s", action)
    services.background.start()  # the loops the wiring built (name census, signer, own certificate)
    sides = [s for s, on in (("controller", services.volumes), ("node", services.staging)) if on is not None]
    log.info("serving %s (%s, node=%s)", endpoint, "+".join(sides), services.node_id)
    sockets = [endpoint.path] if endpoint.path is not None else []
    helpers = []
    if health_listen:
        helpers.append(asyncio.ensure_future(serve_health(health_listen, services.checks, stop)))
    if services.staging is not None:
        helpers.append(asyncio.ensure_future(_limits_loop(services.staging, services.qos_period, stop)))
    started = asyncio.Event()
    if registration is not None:
        helpers.append(asyncio.ensure_future(_register_when_serving(registration, started, stop)))
    try:
        await run_until_stopped(server, grace_seconds, sockets, stop, started=started)
    finally:
        stop.set()
        await asyncio.gather(*helpers, return_exceptions=True)
        await asyncio.to_thread(services.background.stop)


async def _limits_loop(staging: StagingService, period: float, stop: asyncio.Event) -> None:
    """Every ``period`` s: bring each published pod's io.max to its volume's current limits (finishes what a
    publish could not do, applies live changes). A failed pass is logged and retried next period."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), period)
            return
        except TimeoutError:
            pass
        try:
            for action in await asyncio.to_thread(staging.reconcile_limits):
                log.info("limits: %s", action)
        except Exception:
            log.exception("limits reconcile pass failed")


async def _register_when_serving(
    registration: KubeletRegistration, started: asyncio.Event, stop: asyncio.Event
) -> None:
    """Kubelet may call the CSI socket as soon as it sees the registration socket: make that one after."""
    await started.wait()
    await registration.run(stop)
