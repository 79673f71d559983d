"""Composition root of ``nvmeof-csi serve``: builds every concrete dependency from :class:`Settings`. It starts
nothing: the loops that run beside the server go into ``CsiServices.background``, which ``csi.server.serve``
starts once the server is bound and stops, in reverse order, when it stops.

This is the only place that chooses the driver's implementations (real executor, loop or agent backend,
kernel initiator); everything else receives its collaborators through constructors. The agent's composition
root is ``agent_wiring``.
"""

from __future__ import annotations

import logging
import os

from prometheus_client import Counter

from nvmeof_csi import DRIVER_NAME, TOPOLOGY_FABRIC, TOPOLOGY_RDMA
from nvmeof_csi.agentclient.api import HostNqnNodes, replica_client
from nvmeof_csi.agentclient.limits import AgentClients, AgentHostKeys, AgentLimits
from nvmeof_csi.cmd.identity_wiring import build_node_identity, build_signer
from nvmeof_csi.cmd.settings import Backend, Settings
from nvmeof_csi.csi.server import CsiServices
from nvmeof_csi.datasets.client import AlluxioRest
from nvmeof_csi.datasets.locality import CacheLocality
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.fleet.replica_agents import FleetReplicaAgents
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.host.egress_guard import EgressGuard, parse_guard
from nvmeof_csi.host.executor import Executor, SubprocessExecutor
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.keyring import NvmeKeyring, handshake_daemon_running
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.host.tlshd_keyring import publish_when_found
from nvmeof_csi.initiator.connector import NvmeofConnector
from nvmeof_csi.initiator.fabrics import FabricsDevice
from nvmeof_csi.initiator.features import NodeFeatures, rdma_capable
from nvmeof_csi.initiator.identity import ensure_identity
from nvmeof_csi.initiator.metrics import NodeVolumeCollector
from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.initiator.uevents import open_block_events
from nvmeof_csi.kube.api import lazy_api
from nvmeof_csi.kube.nodes import KubeNodes
from nvmeof_csi.kube.replica_records import ReplicaRecords
from nvmeof_csi.loop.backend import LoopTargetBackend
from nvmeof_csi.loop.connector import LoopConnector
from nvmeof_csi.nvmeof.nqn import node_id_for
from nvmeof_csi.rpc.metrics import RpcMetrics
from nvmeof_csi.service.contracts import Connector, NodeDirectory, StaticNodes, TargetBackend
from nvmeof_csi.service.failover import Failover
from nvmeof_csi.service.fence_answers import FenceAnswers
from nvmeof_csi.service.fencing import NoCluster, NodeFacts
from nvmeof_csi.service.provisioning import VolumeService
from nvmeof_csi.service.qos import LimitOverrides, QosEnforcer
from nvmeof_csi.service.records import StagingStore
from nvmeof_csi.service.staging import StagingService
from nvmeof_csi.topology.fabric_map import FabricMap, load_fabric_map
from nvmeof_csi.topology.placement import TOPOLOGY_ZONE

log = logging.getLogger(__name__)


def node_facts(settings: Settings) -> NodeFacts:
    """Where the controller reads Nodes for fencing: a kubeconfig, the pod's service account, or nowhere."""
    if settings.kubeconfig == "none" or not (settings.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST")):
        return NoCluster()
    try:
        # made before the CSI socket serves: the client's import (tens of seconds of CPU on a small node) beside
        # a live server starved its event loop, and the sidecars, which give up on a connection that does not
        # answer within 20 s, crash-looped
        facts = KubeNodes.connect(settings.kubeconfig, DRIVER_NAME, now=True)
    except Exception as exc:  # the client raises its own types for a missing token, a bad file, a bad URL
        if settings.kubeconfig:
            raise ConfigError(f"--kubeconfig {settings.kubeconfig}: {type(exc).__name__}: {exc}"[:300]) from exc
        log.error(  # noqa: TRY400 (the cause is named; a traceback would only repeat it)
            "fencing on the out-of-service taint is OFF: this pod's service account cannot be read (%s); "
            "mount its token or pass --kubeconfig (CSI unpublish reasons still fence)",
            type(exc).__name__,
        )
        return NoCluster()
    log.info("fencing reads Nodes from %s", settings.kubeconfig or "the in-cluster service account")
    return facts


def build_services(settings: Settings, executor: Executor | None = None) -> CsiServices:
    """Everything ``serve`` runs, built and not started (the loops go into ``services.background``)."""
    executor = executor or SubprocessExecutor()
    topology = {TOPOLOGY_FABRIC: settings.fabric}
    if settings.zone:
        topology[TOPOLOGY_ZONE] = settings.zone
    services = CsiServices(
        topology=topology,
        node_id=settings.node_id,
        max_volumes_per_node=settings.max_volumes_per_node,
        workers=settings.workers,
    )
    services.observe = RpcMetrics(services.registry, DRIVER_NAME).observe
    if settings.mode.controller:
        _build_controller(settings, services)
    if settings.mode.node:
        _build_node(settings, services, executor)
    return services


def replica_records(
    settings: Settings, facts: NodeFacts, fabric: FabricMap, services: CsiServices
) -> ReplicaRecords | None:
    """With ``--replica-records``: the arbiter's records, and its passes added to the background loops, each in a
    thread of its own: the fence-peer answers and the failover (every controller replica runs them: each
    decision is a compare-and-swap)."""
    if not settings.replica_records:
        return None
    if not isinstance(facts, KubeNodes):
        raise ConfigError("--replica-records needs the Kubernetes API (the service account or --kubeconfig)")
    records = ReplicaRecords(lazy_api(settings.kubeconfig, "CoordinationV1Api"), settings.replica_records)
    agents = FleetReplicaAgents(fabric, replica_client)
    moves = Counter(
        "nvmeof_csi_replica_moves_total",
        "Replicated volumes the controller moved: unplanned (failover), planned (switchover), split_brain.",
        ["kind"],
        registry=services.registry,
    )
    answers = Counter(
        "nvmeof_csi_fence_peer_answers_total",
        "DRBD fence-peer calls the controller answered: fenced (the asker goes on) or refused (it stays frozen).",
        ["answer"],
        registry=services.registry,
    )
    for kind in ("unplanned", "planned", "split_brain"):
        moves.labels(kind)  # each series at 0 from the start: a rate over them needs no "absent" case
    for answer in ("fenced", "refused"):
        answers.labels(answer)
    fence = FenceAnswers(agents, records, count=lambda answer: answers.labels(answer).inc())
    services.background.add("fence-answers", fence.run)
    failover = Failover(agents, records, count=lambda kind: moves.labels(kind).inc())
    services.background.add("failover", failover.run)  # its promotions wait for fence-answers
    log.info("replicated volumes: records in namespace %s, fence-peer calls answered", settings.replica_records)
    return records


def _build_controller(settings: Settings, services: CsiServices) -> None:
    backend: TargetBackend
    nodes: NodeDirectory
    facts = node_facts(settings)
    if settings.backend is Backend.NVMEOF:
        assert settings.fabric_map is not None
        locality = CacheLocality(AlluxioRest(settings.alluxio_proxy, "")) if settings.alluxio_proxy else None
        fabric = load_fabric_map(settings.fabric_map)
        records = replica_records(settings, facts, fabric, services)
        backend = AgentBackend(fabric, locality=locality, census=True, records=records)
        assert backend.census is not None
        services.background.add("name-census", backend.census.run)
        nodes = HostNqnNodes()
    else:
        backend = LoopTargetBackend(settings.state_dir / "loop", settings.loop_capacity_bytes, services.topology)
        nodes = StaticNodes(frozenset({settings.node_id}))
    services.volumes = VolumeService(backend, nodes, settings.max_volumes_per_node, facts, settings.fence_on)
    signer = build_signer(settings, facts, services.background)
    if signer is not None:  # its liveness is the controller's readiness; its decisions are metrics
        services.checks.append(signer.health)
        services.registry.register(signer)
    services.checks.append(backend.health)


def _nvmeof_connector(
    settings: Settings, services: CsiServices, executor: Executor, clients: AgentClients | None
) -> NvmeofConnector:
    """The kernel initiator with this node's own host identity (made and kept in the state folder)."""
    identity, origin = ensure_identity(settings.state_dir / "node")
    if origin == "regenerated":
        log.warning(
            "the saved host identity was made on another machine (a cloned disk or state folder); "
            "this node now uses the fresh host NQN %s",
            identity.nqn,
        )
    log.info("host identity %s (%s)", identity.nqn, origin)
    if clients is not None:
        build_node_identity(settings, identity.nqn, clients, services.background)
    services.node_id = node_id_for(identity.nqn)
    services.topology[TOPOLOGY_RDMA] = "true" if rdma_capable() else "false"
    return NvmeofConnector(
        executor,
        NvmeSysfs(),
        identity,
        settings.allow_single_path,
        block_events=open_block_events,
        host_keys=AgentHostKeys(clients, identity.nqn) if clients else None,
        features=NodeFeatures(
            cgroup_root=settings.cgroup_root,
            authenticates=FabricsDevice().authenticates,
            tls_capable=lambda: "tls" in FabricsDevice().options(),
            handshake_daemon=handshake_daemon_running,
        ),
    )


def _build_node(settings: Settings, services: CsiServices, executor: Executor) -> None:
    nvmeof = settings.backend is Backend.NVMEOF
    # one set of agent clients for the node's keys and its I/O limits (the fabric map is read once)
    clients = (
        AgentClients(load_fabric_map(settings.fabric_map, ca_only=settings.node_identity == "csr"))
        if nvmeof and settings.fabric_map
        else None
    )
    connector: Connector = (
        _nvmeof_connector(settings, services, executor, clients) if nvmeof else LoopConnector(executor)
    )
    if settings.egress_guard:  # the node's pods kept off the portals, checked again every minute
        services.background.add("egress-guard", EgressGuard(parse_guard(settings.egress_guard), executor).run)
    if settings.keyring_serial_file is not None:  # for tlshd in its own container (nvmeof-csi tlshd)
        services.background.add("keyring-serial", publish_when_found(settings.keyring_serial_file, NvmeKeyring()))
    store = StagingStore(settings.state_dir / "staging")
    qos = QosEnforcer(PodCgroups(settings.cgroup_root), LimitOverrides(settings.state_dir / "qos"))
    if clients is None and nvmeof:
        log.warning("no --fabric-map: live changes of I/O limits (ControllerModifyVolume) do not reach this node")
    services.staging = StagingService(
        connector,
        Mounter(executor),
        Filesystems(executor),
        store,
        root=settings.kubelet_root,
        qos=qos,
        limits_source=AgentLimits(clients) if clients is not None else None,
    )
    services.qos_period = settings.qos_period
    if nvmeof:
        services.registry.register(
            NodeVolumeCollector(store.all, NvmeSysfs(), qos, settings.metrics_pod_uid, connector.orphan_stats)
        )
    services.checks.append(connector.health)
