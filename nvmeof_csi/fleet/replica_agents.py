"""The fabric map's agents as the controller's arbiter reaches them (``service/fence_answers.py``'s
:class:`~nvmeof_csi.service.fence_answers.ReplicaAgents` and ``service/failover.py``'s
:class:`~nvmeof_csi.service.failover.FailoverAgents`): one client per agent, made on first use and kept.

Contract: every method names an agent by its fabric map name; a name the map does not list is ``NotFound``;
an agent that cannot be reached raises the client's error (``Unavailable``), which the arbiter's pass treats as
"ask again next time".
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from nvmeof_csi.agentclient.api import ReplicaApi
from nvmeof_csi.errors import DriverError, NotFound
from nvmeof_csi.service.failover import AgentStatus, ReplicaState
from nvmeof_csi.service.fence_answers import FenceCall
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap


class FleetReplicaAgents:
    def __init__(self, fabric: FabricMap, client: Callable[[AgentEntry], ReplicaApi]) -> None:
        self._fabric, self._factory = fabric, client
        self._clients: dict[str, ReplicaApi] = {}
        self._lock = threading.Lock()

    def _client(self, agent: str) -> ReplicaApi:
        entry = self._fabric.agent(agent)
        if entry is None:
            raise NotFound(f"agent {agent!r} is not in the fabric map")
        with self._lock:
            if agent not in self._clients:
                self._clients[agent] = self._factory(entry)
            return self._clients[agent]

    def names(self) -> list[str]:
        return [entry.name for entry in self._fabric.agents]

    def fence_calls(self, agent: str) -> list[FenceCall]:
        return [FenceCall(agent, r.volume_uuid, r.pid, r.epoch) for r in self._client(agent).fence_requests()]

    def answer(self, call: FenceCall, peer_fenced: bool) -> bool:
        return self._client(call.agent).answer_fence(call.volume_uuid, call.pid, peer_fenced)

    def set_role(self, agent: str, vol_uuid: str, role: str, epoch: int) -> None:
        self._client(agent).set_replica_role(vol_uuid, role, epoch)

    def status(self, agent: str) -> AgentStatus | None:
        """``agent``'s answer to its Health call; ``None`` when it does not answer (an agent the map does not
        list never does)."""
        try:
            health = self._client(agent).health()
        except DriverError:
            return None
        return AgentStatus(draining=health.draining)

    def replica(self, agent: str, vol_uuid: str) -> ReplicaState:
        r = self._client(agent).get_volume(vol_uuid).replica
        return ReplicaState(r.role, int(r.epoch), r.connection, r.disk, r.drbd_role)


__all__ = ["FleetReplicaAgents"]
