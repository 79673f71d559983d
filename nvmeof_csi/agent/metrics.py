"""The target agent's own metrics, read at scrape time from its state, the pool and configfs:

| metric | labels | meaning |
|---|---|---|
| ``nvmeof_csi_agent_pool_bytes`` | agent | size of the pool's filesystem |
| ``nvmeof_csi_agent_pool_free_bytes`` | agent | free bytes in it |
| ``nvmeof_csi_agent_provisioned_bytes`` | agent | sum of the volumes' sizes (thin) |
| ``nvmeof_csi_agent_capacity_bytes`` | agent | what may be provisioned (the limit, or the pool) |
| ``nvmeof_csi_agent_volumes`` | agent, status | volumes by status (creating, ready, deleting) |
| ``nvmeof_csi_agent_subsystems`` | agent | subsystems in configfs |
| ``nvmeof_csi_agent_volume_allowed_hosts`` | agent, volume_uuid | hosts allowed on each volume |
| ``nvmeof_csi_agent_drift_objects`` | agent | configfs objects and pool files the agent's state does not know |
| ``nvmeof_csi_agent_fenced_hosts`` | agent, reason | host fences in force, by reason (``agent/fencing.py``) |
| ``nvmeof_csi_agent_replica_in_sync`` | agent, volume_uuid, role | 1: both replicas UpToDate, connected |
| ``nvmeof_csi_agent_replica_out_of_sync_bytes`` | agent, volume_uuid | what a resync still has to copy |
| ``nvmeof_csi_agent_draining`` | agent | 1 while ``nvmeofctl storage drain`` has the node draining |

Label sets are bounded by this agent's volumes. Contract: collecting never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from nvmeof_csi.agent.target_agent import TargetAgent

log = logging.getLogger(__name__)


class AgentCollector(Collector):
    def __init__(self, agent: TargetAgent, drift: Callable[[], int]) -> None:
        self._agent = agent
        self._drift = drift

    def collect(self) -> Iterator[GaugeMetricFamily]:
        name = self._agent.name
        families = []
        try:
            usage = self._agent.store.usage()
            for metric, help_, value in (
                ("pool_bytes", "Size of the pool filesystem.", usage.total_bytes),
                ("pool_free_bytes", "Free bytes in the pool filesystem.", usage.free_bytes),
                (
                    "provisioned_bytes",
                    "Sum of the volumes' sizes (thin provisioning).",
                    self._agent.provisioned_bytes(),
                ),
                ("capacity_bytes", "Bytes that may be provisioned in all.", self._agent.capacity_bytes()),
                ("subsystems", "NVMe-oF subsystems in configfs.", len(self._agent.nvmet.subsystems())),
                ("drift_objects", "Objects in configfs or the pool the agent's state does not know.", self._drift()),
            ):
                family = GaugeMetricFamily(f"nvmeof_csi_agent_{metric}", help_, labels=["agent"])
                family.add_metric([name], value)
                families.append(family)
            by_status = GaugeMetricFamily("nvmeof_csi_agent_volumes", "Volumes by status.", labels=["agent", "status"])
            hosts = GaugeMetricFamily(
                "nvmeof_csi_agent_volume_allowed_hosts",
                "Hosts allowed on each volume.",
                labels=["agent", "volume_uuid"],
            )
            fenced = GaugeMetricFamily(
                "nvmeof_csi_agent_fenced_hosts", "Host fences in force, by reason.", labels=["agent", "reason"]
            )
            in_sync = GaugeMetricFamily(
                "nvmeof_csi_agent_replica_in_sync",
                "1 while the replica and its peer are both UpToDate over a live connection.",
                labels=["agent", "volume_uuid", "role"],
            )
            behind = GaugeMetricFamily(
                "nvmeof_csi_agent_replica_out_of_sync_bytes",
                "Bytes a resync of the replica pair still has to copy.",
                labels=["agent", "volume_uuid"],
            )
            draining = GaugeMetricFamily(
                "nvmeof_csi_agent_draining", "1 while an operator has this node draining.", labels=["agent"]
            )
            draining.add_metric([name], int(self._agent.drain.draining()))
            counts: dict[str, int] = {}
            reasons: dict[str, int] = {}
            for view in self._agent.list_volumes():
                counts[view.record.status] = counts.get(view.record.status, 0) + 1
                hosts.add_metric([name, view.record.uuid], len(view.record.hosts))
                for mark in view.record.fenced.values():
                    reasons[mark["reason"]] = reasons.get(mark["reason"], 0) + 1
                if view.record.replica:
                    drbd = self._agent.replica_state(view.record)
                    role = view.record.replica.get("role", "")
                    in_sync.add_metric([name, view.record.uuid, role], int(drbd is not None and drbd.in_sync))
                    behind.add_metric([name, view.record.uuid], ((drbd.out_of_sync_kib or 0) if drbd else 0) << 10)
            for status, count in sorted(counts.items()):
                by_status.add_metric([name, status], count)
            for reason, count in sorted(reasons.items()):
                fenced.add_metric([name, reason], count)
            families += [by_status, hosts, fenced, in_sync, behind, draining]
        except Exception:
            log.exception("metrics: agent state could not be read")
        yield from families
