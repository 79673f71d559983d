"""Where the controller keeps a CSI volume name's reservation (name -> volume UUID and agent), and how it finds one.

Contract:
- A name's *home* is the agent chosen by rendezvous hashing (the highest sha256 of ``agent name + NUL + volume
  name``) among the agents the request could use (``could_hold``). Controllers given the same request and fabric
  map choose the same home, so ``ReserveName`` there (create-if-absent in one atomic step, ``agent/names.py``) is
  the one place where racing controllers agree on one UUID and one placement before anything is made. No clock
  is compared anywhere.
- Adding or removing an agent moves the home of about 1/N of the names. A lookup that misses at the home asks
  the agents the name census saw the name on (``fleet/census.py``; every agent while the census is not
  complete, or without one) for a reservation or a live volume of that name, so what was kept elsewhere (a
  changed map or topology, a volume made by an older driver) is still found; a reservation found is preferred to a
  volume found by name.
- An unreachable home fails with UNAVAILABLE (a reservation is never kept anywhere else instead); in the scan, an
  unreachable agent fails it only when the request could have used that agent.
- :meth:`NameDirectory.find` only reads; :meth:`NameDirectory.reserve` and :meth:`NameDirectory.release` write.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nvmeof_csi.agentclient.api import AgentApi
from nvmeof_csi.errors import ResourceExhausted, Unavailable
from nvmeof_csi.fleet.census import NameCensus
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap

log = logging.getLogger(__name__)

CouldHold = Callable[[AgentEntry], bool]


@dataclass(frozen=True)
class Held:
    """What is known of a name: its volume's UUID and agent; ``kept_on`` names the agent that keeps the
    reservation ("" when none is kept and the volume was found by its name)."""

    name: str
    uuid: str
    agent: str
    kept_on: str


class NameDirectory:
    def __init__(
        self, fabric: FabricMap, client: Callable[[AgentEntry], AgentApi], census: NameCensus | None = None
    ) -> None:
        self._fabric = fabric
        self._client = client
        self._census = census

    def home(self, name: str, could_hold: CouldHold) -> AgentEntry | None:
        """The agent that keeps ``name``'s reservation for requests that could use the agents ``could_hold``
        accepts; ``None`` when it accepts none."""
        candidates = [e for e in self._fabric.agents if could_hold(e)]
        return max(candidates, key=lambda e: hashlib.sha256(f"{e.name}\0{name}".encode()).digest(), default=None)

    def _ask(self, entry: AgentEntry, name: str) -> Held | None:
        found = self._client(entry).lookup_name(name)
        if found is None:
            return None
        if found.agent:
            return Held(name, found.volume_uuid, found.agent, entry.name)
        return Held(name, found.volume_uuid, entry.name, "")

    def find(self, name: str, could_hold: CouldHold) -> Held | None:
        """What the home keeps for ``name``; on a miss, what any agent keeps or holds under that name."""
        home = self.home(name, could_hold)
        if home is not None:
            held = self._ask(home, name)
            if held is not None:
                return held
        found = []
        known = self._census.where(name) if self._census is not None else None  # None: ask every agent
        for entry in self._fabric.agents:
            if (home is not None and entry.name == home.name) or (known is not None and entry.name not in known):
                continue
            try:
                held = self._ask(entry, name)
            except Unavailable as err:
                if could_hold(entry):
                    raise
                log.warning(
                    "agent %s skipped in the lookup of %s (%s): this request could not use it", entry.name, name, err
                )
                continue
            if held is not None:
                found.append(held)
        return min(found, key=lambda h: (not h.kept_on, h.agent, h.uuid), default=None)

    def reserve(self, name: str, vol_uuid: str, agent: str, could_hold: CouldHold) -> Held:
        """Reserve ``name`` for ``vol_uuid`` on ``agent`` at its home unless reserved already; the one kept."""
        home = self.home(name, could_hold)
        if home is None:
            raise ResourceExhausted(f"no agent can take volume {name!r} (transport or topology)")
        kept = self._client(home).reserve_name(name, vol_uuid, agent)
        if self._census is not None:
            self._census.note(name, home.name, kept.agent)
        return Held(name, kept.volume_uuid, kept.agent, home.name)

    def release(self, name: str, vol_uuid: str, kept_on: str) -> None:
        """Remove ``name``'s reservation of ``vol_uuid`` where it is kept (every reachable agent when that is
        not known: a volume made before reservations, whose adoption may have kept one anywhere)."""
        entry = self._fabric.agent(kept_on) if kept_on else None
        if entry is not None:
            self._client(entry).release_name(name, vol_uuid)
            return
        for each in self._fabric.agents:
            try:
                self._client(each).release_name(name, vol_uuid)
            except Unavailable as err:
                log.warning("agent %s unreachable while releasing the name %s: %s", each.name, name, err)
