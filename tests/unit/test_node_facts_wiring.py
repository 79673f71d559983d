"""Where the controller reads Nodes for fencing: nowhere outside a cluster or with ``--kubeconfig none``; a
kubeconfig that cannot be read stops the start with a ConfigError naming it; a pod whose service account cannot
be read keeps serving with the taint rule off and says so (unpublish reasons still fence)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nvmeof_csi.cmd.settings import Settings
from nvmeof_csi.cmd.wiring import node_facts
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.service.fencing import NoCluster


def test_no_cluster_no_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert isinstance(node_facts(Settings()), NoCluster)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert isinstance(node_facts(Settings(kubeconfig="none")), NoCluster)


def test_a_kubeconfig_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--kubeconfig"):
        node_facts(Settings(kubeconfig=str(tmp_path / "missing")))


def test_a_pod_without_its_token_serves_with_the_taint_rule_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with caplog.at_level(logging.ERROR):
        assert isinstance(node_facts(Settings()), NoCluster)
    assert "out-of-service taint is OFF" in caplog.text


def test_replica_records_need_a_namespace_and_the_kubernetes_api(tmp_path: Path) -> None:
    from nvmeof_csi.cmd.wiring import replica_records
    from nvmeof_csi.csi.server import CsiServices
    from nvmeof_csi.topology.fabric_map import FabricMap

    services = CsiServices(topology={}, node_id="n", max_volumes_per_node=1, workers=1)
    assert replica_records(Settings(), NoCluster(), FabricMap(()), services) is None and not services.background.loops
    with pytest.raises(ConfigError, match="needs the Kubernetes API"):
        replica_records(Settings(replica_records="nvmeof-csi"), NoCluster(), FabricMap(()), services)
    with pytest.raises(ConfigError, match="must be a namespace"):
        Settings(replica_records="../etc")


def test_replica_records_add_both_passes_and_their_counters_at_zero() -> None:
    from nvmeof_csi.cmd.wiring import replica_records
    from nvmeof_csi.csi.server import CsiServices
    from nvmeof_csi.kube.nodes import KubeNodes
    from nvmeof_csi.topology.fabric_map import FabricMap

    services = CsiServices(topology={}, node_id="n", max_volumes_per_node=1, workers=1)
    facts = KubeNodes(object(), object(), "csi.nvmeof.io")  # the API is made at its first use: never, here
    assert replica_records(Settings(replica_records="nvmeof-csi"), facts, FabricMap(()), services) is not None
    assert sorted(name for name, _ in services.background.loops) == ["failover", "fence-answers"]
    seen = {(s.name, tuple(s.labels.values())): s.value for m in services.registry.collect() for s in m.samples}
    for kind in ("unplanned", "planned", "split_brain"):
        assert seen[("nvmeof_csi_replica_moves_total", (kind,))] == 0
    assert seen[("nvmeof_csi_fence_peer_answers_total", ("refused",))] == 0
