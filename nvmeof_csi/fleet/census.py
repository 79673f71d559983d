"""Which agents know a volume name, gathered in the background from every agent's volumes, so that a name its home
does not know (every new name) is looked for only where the census saw it instead of on every agent: a create costs
the same with 1 agent or 64, and one dead agent does not stop every create.

Contract:
- The census is *complete* once every agent of the fabric map has listed its volumes (ListVolumes, every page) at
  least once since this controller started. Until then :meth:`NameCensus.where` returns ``None`` and the name
  directory asks every agent, as without a census (``fleet/names.py``).
- ``where(name)``: the agents that held a volume called ``name`` (and the agent its ``name-kept-on`` label names,
  which keeps its reservation) at their last listing, plus what this controller reserved itself since
  (:meth:`NameCensus.note`). It may name agents that no longer hold the name: they are asked and say no.
- Each agent is listed again every ``refresh`` seconds (:data:`REFRESH`); an agent that does not answer keeps its
  last listing and is tried again after :data:`RETRY` seconds. What the census cannot see: a name another
  controller process reserved since the last listing away from its home (another fabric map during a rolling
  update, or the same name asked with other parameters), and a reservation whose volume was never made; the
  window is one refresh.
Thread-safe; :meth:`NameCensus.sweep` never raises for an agent that cannot be listed (logged).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from nvmeof_csi.agentclient.api import AgentApi
from nvmeof_csi.errors import DriverError
from nvmeof_csi.topology.fabric_map import AgentEntry

log = logging.getLogger(__name__)

REFRESH = 300.0
RETRY = 30.0
KEPT_ON_LABEL = "csi.nvmeof.io/name-kept-on"


class NameCensus:
    def __init__(
        self,
        agents: Sequence[AgentEntry],
        client: Callable[[AgentEntry], AgentApi],
        clock: Callable[[], float] = time.monotonic,
        refresh: float = REFRESH,
    ) -> None:
        self._agents = agents
        self._client = client
        self._clock = clock
        self._refresh = refresh
        self._listed: dict[str, dict[str, frozenset[str]]] = {}  # agent -> name -> agents that know it
        self._noted: dict[str, tuple[frozenset[str], float]] = {}  # name -> (agents, when) reserved here
        self._index: dict[str, frozenset[str]] = {}
        self._announced = False
        self._lock = threading.Lock()

    @property
    def complete(self) -> bool:
        with self._lock:
            return all(e.name in self._listed for e in self._agents)

    def where(self, name: str) -> frozenset[str] | None:
        """The agents that know ``name`` (see the module's contract); ``None`` while the census is incomplete."""
        with self._lock:
            if not all(e.name in self._listed for e in self._agents):
                return None
            noted = self._noted.get(name)
            return self._index.get(name, frozenset()) | (noted[0] if noted else frozenset())

    def note(self, name: str, *agents: str) -> None:
        """This controller reserved ``name`` (kept on, and placed on, ``agents``)."""
        with self._lock:
            before = self._noted.get(name, (frozenset(), 0.0))[0]
            self._noted[name] = (before | frozenset(agents), self._clock())

    def sweep(self) -> bool:
        """List every agent once; ``True`` when each answered."""
        began, answered = self._clock(), True
        for entry in self._agents:
            try:
                volumes = self._client(entry).list_volumes()
            except DriverError as err:
                log.warning("name census: agent %s not listed (%s); its last listing is kept", entry.name, err)
                answered = False
                continue
            found: dict[str, set[str]] = {}
            for vol in volumes:
                found.setdefault(vol.name, set()).update({entry.name, vol.labels.get(KEPT_ON_LABEL) or entry.name})
            with self._lock:
                self._listed[entry.name] = {name: frozenset(at) for name, at in found.items()}
        merged: dict[str, set[str]] = {}
        with self._lock:
            for listing in self._listed.values():
                for name, at in listing.items():
                    merged.setdefault(name, set()).update(at)
            self._index = {name: frozenset(at) for name, at in merged.items()}
            if answered:  # every reservation noted before this sweep began is in a listing now (or gone)
                self._noted = {n: v for n, v in self._noted.items() if v[1] >= began}
            first = answered and not self._announced
            self._announced |= answered
        if first:
            log.info("name census complete: %d agents, %d names", len(self._agents), len(merged))
        return answered

    def run(self, stop: threading.Event) -> None:
        """Sweep until ``stop`` is set: every ``refresh`` seconds, or :data:`RETRY` after an agent did not answer."""
        while not stop.is_set():
            stop.wait(self._refresh if self.sweep() else min(RETRY, self._refresh))
