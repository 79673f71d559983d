"""What Prometheus scrapes: RPC durations with the sidecars' metric name and labels, the node's per-volume path
and I/O metrics read from sysfs, and the agent's pool, volume and host metrics."""

from __future__ import annotations

from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry, generate_latest

from nvmeof_csi.agent.metrics import AgentCollector
from nvmeof_csi.agent.replica_spec import ReplicaSpec
from nvmeof_csi.initiator.metrics import NodeVolumeCollector
from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.rpc.metrics import RpcMetrics, go_code_name
from nvmeof_csi.service.contracts import OrphanStats
from nvmeof_csi.service.records import AccessSpec, StagingRecord
from tests.support.agents import make_agent
from tests.support.drbd_kernel import Kernel, replicated_agent
from tests.unit.test_connector import VOL, connector, ctx
from tests.unit.test_replica_agent import PAIR

HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_rpc_metrics_use_the_sidecars_names_and_go_code_names() -> None:
    assert [
        go_code_name(c)
        for c in (
            grpc.StatusCode.OK,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
    ] == ["OK", "DeadlineExceeded", "Canceled", "FailedPrecondition"]
    registry = CollectorRegistry()
    metrics = RpcMetrics(registry, "csi.nvmeof.io")
    metrics.observe("/csi.v1.Node/NodeStageVolume", grpc.StatusCode.OK, 1.5)
    metrics.observe("/csi.v1.Node/NodeStageVolume", grpc.StatusCode.ABORTED, 0.01)
    labels = {"driver_name": "csi.nvmeof.io", "method_name": "/csi.v1.Node/NodeStageVolume"}
    assert sample(registry, "csi_plugin_operations_seconds_count", grpc_status_code="OK", **labels) == 1
    assert sample(registry, "csi_plugin_operations_seconds_sum", grpc_status_code="OK", **labels) == 1.5
    assert sample(registry, "csi_plugin_operations_seconds_count", grpc_status_code="Aborted", **labels) == 1


def test_node_volume_metrics_come_from_sysfs(tmp_path: Path) -> None:
    conn, _ = connector(tmp_path)
    context = ctx(VOL)
    conn.connect(VOL, context, 30)
    # /sys/block/<head>/stat: reads, merges, sectors, ms, writes, merges, sectors, ms, ...
    (tmp_path / "block" / "nvme0n1" / "stat").write_text("100 0 800 250 40 0 160 90 0 0 0 0 0 0 0 0 0\n")
    record = StagingRecord("nvmeof-v1.lab." + VOL.uuid, VOL, "/k/staging", AccessSpec(block=True), context)
    registry = CollectorRegistry()
    registry.register(NodeVolumeCollector(lambda: [record], NvmeSysfs(tmp_path)))
    vid = record.volume_id
    assert sample(registry, "nvmeof_csi_volume_paths", volume_id=vid, state="live") == 2
    assert sample(registry, "nvmeof_csi_volume_paths_expected", volume_id=vid) == 2
    assert sample(registry, "nvmeof_csi_volume_path_ana_state", volume_id=vid, ana_state="optimized") == 1
    assert sample(registry, "nvmeof_csi_volume_reads_total", volume_id=vid) == 100
    assert sample(registry, "nvmeof_csi_volume_read_bytes_total", volume_id=vid) == 800 * 512
    assert sample(registry, "nvmeof_csi_volume_write_seconds_total", volume_id=vid) == 0.09
    (tmp_path / "class" / "nvme" / "nvme1" / "state").write_text("connecting\n")
    assert sample(registry, "nvmeof_csi_volume_paths", volume_id=vid, state="connecting") == 1
    broken = StagingRecord("x", VOL, "/k/s", AccessSpec(block=True), {"nqn": "garbage"})
    registry2 = CollectorRegistry()
    registry2.register(NodeVolumeCollector(lambda: [broken, record], NvmeSysfs(tmp_path)))
    assert b"nvmeof_csi_volume_reads_total" in generate_latest(registry2)  # one bad record fails nothing


def test_node_orphan_release_metrics(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    registry.register(NodeVolumeCollector(list, NvmeSysfs(tmp_path), orphans=lambda: OrphanStats(2, 5)))
    assert sample(registry, "nvmeof_csi_node_unreleased_subsystems") == 2
    assert sample(registry, "nvmeof_csi_node_orphan_release_failures_total") == 5


def test_agent_metrics(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, capacity=10 << 20)
    agent.converge()
    vol = agent.create_volume("v", 4 << 20, VolumeParameters.parse({}), {}).record
    agent.allow_host(vol.uuid, HOST)
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, lambda: 3))
    assert sample(registry, "nvmeof_csi_agent_volumes", agent="store-a", status="ready") == 1
    assert sample(registry, "nvmeof_csi_agent_volume_allowed_hosts", volume_uuid=vol.uuid) == 1
    assert sample(registry, "nvmeof_csi_agent_provisioned_bytes") == 4 << 20
    assert sample(registry, "nvmeof_csi_agent_capacity_bytes") == 10 << 20
    assert sample(registry, "nvmeof_csi_agent_subsystems") == 1
    assert sample(registry, "nvmeof_csi_agent_drift_objects") == 3
    assert (sample(registry, "nvmeof_csi_agent_pool_bytes") or 0) > 0
    agent.fence_host(vol.uuid, HOST, "NODE_OUT_OF_SERVICE")
    assert sample(registry, "nvmeof_csi_agent_fenced_hosts", reason="NODE_OUT_OF_SERVICE") == 1
    assert sample(registry, "nvmeof_csi_agent_volume_allowed_hosts", volume_uuid=vol.uuid) == 0
    assert sample(registry, "nvmeof_csi_agent_draining") == 0
    agent.drain.set(True)
    assert sample(registry, "nvmeof_csi_agent_draining") == 1
    assert sample(registry, "nvmeof_csi_agent_replica_in_sync") is None  # no replicated volume here


def test_a_replicas_sync_is_a_metric(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = agent.create_volume("r", 64 << 20, VolumeParameters.parse({}), {}, replica=ReplicaSpec.parse(PAIR))
    agent.set_replica_role(vol.record.uuid, "primary", 1)
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, lambda: 0))
    assert sample(registry, "nvmeof_csi_agent_replica_in_sync", volume_uuid=vol.record.uuid, role="primary") == 1
    assert kernel.minor is not None
    kernel.minor.update(cs="SyncSource", pds="Inconsistent", oos="2048")
    assert sample(registry, "nvmeof_csi_agent_replica_in_sync", role="primary") == 0
    assert sample(registry, "nvmeof_csi_agent_replica_out_of_sync_bytes", volume_uuid=vol.record.uuid) == 2 << 20
