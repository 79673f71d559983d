"""The agents of a fabric map as the controller's backend sees them: one client per agent (made on first use and
kept), lookups by name, readiness, and the free capacity placement chooses from.

Contract: :meth:`AgentFleet.health` is ready while at least one agent answers ready; an agent that cannot be
reached is left out of placement (logged), never fatal; placement reads free capacity through a cache with bounded
staleness (``fleet/capacity.py``), not from every agent on every create; ``_require`` raises
``NotFound`` for a location the map does not list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nvmeof_csi.agentclient.api import AgentApi
from nvmeof_csi.errors import DriverError, NotFound
from nvmeof_csi.fleet.capacity import FRESH_FOR, CapacityCache
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import Health, Topology, VolumeRef
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap
from nvmeof_csi.topology.placement import Candidate, capacity_in

log = logging.getLogger(__name__)


class AgentFleet:
    def __init__(
        self,
        fabric: FabricMap,
        client: Callable[[AgentEntry], AgentApi],
        clock: Callable[[], float] = time.monotonic,
        fresh_for: float = FRESH_FOR,
    ) -> None:
        self.fabric = fabric
        self._factory = client
        self._clients: dict[str, AgentApi] = {}
        self._lock = threading.Lock()
        self.capacity_seen = CapacityCache(self._free_bytes, clock, fresh_for)

    def _client(self, entry: AgentEntry) -> AgentApi:
        with self._lock:
            if entry.name not in self._clients:
                self._clients[entry.name] = self._factory(entry)
            return self._clients[entry.name]

    def _entry(self, location: str) -> AgentEntry | None:
        return self.fabric.agent(location)

    def client_of(self, entry: AgentEntry) -> AgentApi:
        """The client of ``entry`` (made on first use and kept)."""
        return self._client(entry)

    def entry_of(self, name: str) -> AgentEntry | None:
        """The fabric map's agent ``name`` (``None``: not listed)."""
        return self._entry(name)

    # -- health and capacity -----------------------------------------------------------------------------
    def health(self) -> Health:
        down = []
        for entry in self.fabric.agents:
            try:
                if not self._client(entry).health().ready:
                    down.append(f"{entry.name} (not ready)")
            except DriverError as err:
                down.append(f"{entry.name} ({err})")
        ready = len(down) < len(self.fabric.agents)
        return Health(ready, "all agents answer" if not down else f"unreachable or not ready: {', '.join(down)}")

    def _free_bytes(self, entry: AgentEntry) -> int:
        return max((p.free_bytes for p in self._client(entry).capacity()), default=0)

    def _candidates(self) -> list[Candidate]:
        """The agents that answer, with their free bytes at most ``fresh_for`` seconds old
        (``fleet/capacity.py``)."""
        return self.capacity_seen.candidates(self.fabric.agents)

    def available_capacity(self, segment: Topology | None, parameters: VolumeParameters | None = None) -> int:
        return capacity_in(self._candidates(), parameters.transport if parameters else "tcp", segment)

    def max_volume_size(self) -> int:
        return max((c.free_bytes for c in self._candidates()), default=0)

    def _require(self, ref: VolumeRef) -> AgentEntry:
        entry = self._entry(ref.location)
        if entry is None:
            raise NotFound(f"volume {ref.uuid} does not exist (unknown agent {ref.location})")
        return entry
