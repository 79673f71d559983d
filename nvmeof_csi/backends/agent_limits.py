"""The node's :data:`~nvmeof_csi.service.qos.LimitsSource` over the target agents: a staged volume's current
mutable parameters (its per-pod I/O limits), read with the agent's ``node`` role (GetVolume of the volumes that
allow this node's host NQN only) from the agent named in the volume context.

Contract: returns ``None`` when the volume's agent is not in the fabric map; raises the agent client's
``DriverError`` when it cannot be reached (the caller keeps the limits in force). Clients are kept per agent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from nvmeof_csi.backends.agent_api import AgentApi, default_client
from nvmeof_csi.nvmeof.qos import QOS_KEY_NAMES
from nvmeof_csi.service.records import StagingRecord
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap


class AgentLimits:
    def __init__(self, fabric: FabricMap, client: Callable[[AgentEntry], AgentApi] = default_client) -> None:
        self._fabric = fabric
        self._factory = client
        self._clients: dict[str, AgentApi] = {}
        self._lock = threading.Lock()

    def __call__(self, record: StagingRecord) -> Mapping[str, str] | None:
        entry = self._fabric.agent(record.context.get("agent", "") or record.ref.location)
        if entry is None:
            return None
        with self._lock:
            client = self._clients.setdefault(entry.name, self._factory(entry))
        volume = client.get_volume(vol_uuid=record.ref.uuid)
        return {k: v for k, v in volume.parameters.items() if k in QOS_KEY_NAMES}
