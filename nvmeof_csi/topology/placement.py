"""Topology segments and placement, as pure functions.

A node's segment (NodeGetInfo) has ``topology.csi.nvmeof.io/fabric``, ``topology.csi.nvmeof.io/transport-rdma``
("true"/"false") and optionally ``topology.kubernetes.io/zone``. A node reaches an agent when the fabric (and
the zone, where the agent names one) are equal, and, for an RDMA volume, the node has RDMA. A key missing from
a requested segment does not constrain it.

Placement: candidates are the agents that offer the transport and have room; with ``requisite`` segments only
agents reachable from at least one of them; ``preferred`` segments are tried in order, and within the first
one that any candidate serves, the agent with the most free capacity wins (ties by name). For a dataset
volume, ``cached`` (agent name -> bytes of the data set Alluxio holds on the worker next to that agent) comes
first: among the candidates, the one next to the most cached bytes wins (dataset locality is a preference;
requisite segments still bind).

A replicated volume (``replicas: "2"``) goes to a pair (:func:`place_pair`): two agents on different storage
nodes (the map's ``node``, else the agent) with the same volume segment, so every node that reaches one
reaches the other (a zone in the map limits who reaches an agent: two replicas in two zones would leave no
zoned node able to fail over). The first is chosen as :func:`place` chooses among the agents that have such a
partner; the partner is the one with the most room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvmeof_csi import TOPOLOGY_FABRIC, TOPOLOGY_RDMA
from nvmeof_csi.errors import NotFound, ResourceExhausted
from nvmeof_csi.service.contracts import ContentSource, Topology, TopologyRequirement
from nvmeof_csi.topology.fabric_map import AgentEntry

TOPOLOGY_ZONE = "topology.kubernetes.io/zone"


@dataclass(frozen=True)
class Candidate:
    agent: AgentEntry
    free_bytes: int


def volume_segment(agent: AgentEntry, transport: str) -> dict[str, str]:
    """The segment whose nodes can reach a volume on ``agent`` over ``transport``."""
    segment = {TOPOLOGY_FABRIC: agent.fabric}
    if agent.zone:
        segment[TOPOLOGY_ZONE] = agent.zone
    if transport == "rdma":
        segment[TOPOLOGY_RDMA] = "true"
    return segment


def reachable(agent: AgentEntry, transport: str, node: Mapping[str, str]) -> bool:
    """True when a node in segment ``node`` reaches ``agent`` over ``transport``."""
    if transport not in agent.transports:
        return False
    if TOPOLOGY_FABRIC in node and node[TOPOLOGY_FABRIC] != agent.fabric:
        return False
    if agent.zone and TOPOLOGY_ZONE in node and node[TOPOLOGY_ZONE] != agent.zone:
        return False
    return not (transport == "rdma" and node.get(TOPOLOGY_RDMA, "true") != "true")


def place(
    candidates: Sequence[Candidate],
    size: int,
    transport: str,
    requirement: TopologyRequirement | None,
    cached: Mapping[str, int] | None = None,
) -> AgentEntry:
    """The agent a new volume goes to; see the module docstring. Raises ``ResourceExhausted``."""
    fits = [c for c in candidates if transport in c.agent.transports and c.free_bytes >= size]
    if requirement and requirement.requisite:
        fits = [c for c in fits if any(reachable(c.agent, transport, t) for t in requirement.requisite)]
    if not fits:
        raise ResourceExhausted(f"no agent offers {transport} with {size} bytes free in the requested topology")
    best = sorted(fits, key=lambda c: (-c.free_bytes, c.agent.name))
    near = sorted(
        (c for c in best if (cached or {}).get(c.agent.name, 0) > 0), key=lambda c: -(cached or {})[c.agent.name]
    )
    if near:
        return near[0].agent
    for preferred in requirement.preferred if requirement else ():
        served = [c for c in best if reachable(c.agent, transport, preferred)]
        if served:
            return served[0].agent
    return best[0].agent


def capacity_in(candidates: Sequence[Candidate], transport: str, segment: Topology | None) -> int:
    """Free bytes reachable from ``segment`` (all agents when it is ``None``)."""
    return sum(c.free_bytes for c in candidates if segment is None or reachable(c.agent, transport, segment))


def _node_of(agent: AgentEntry) -> str:
    return agent.node or agent.name


def place_pair(
    candidates: Sequence[Candidate],
    size: int,
    transport: str,
    requirement: TopologyRequirement | None,
    cached: Mapping[str, int] | None = None,
) -> tuple[AgentEntry, AgentEntry]:
    """The two agents of a replicated volume (see the module docstring). Raises ``ResourceExhausted`` saying why
    when no pair has room."""
    fits = [c for c in candidates if transport in c.agent.transports and c.free_bytes >= size]
    paired = [c for c in fits if _partners(c.agent, fits, transport)]
    if not paired:
        raise ResourceExhausted(
            f"replicas 2: no two agents on different storage nodes with one fabric and zone offer {transport} with "
            f"{size} bytes free each ({len(fits)} agent(s) have room)"
        )
    first = place(paired, size, transport, requirement, cached)
    return first, _partners(first, fits, transport)[0].agent


def _partners(first: AgentEntry, fits: Sequence[Candidate], transport: str) -> list[Candidate]:
    segment = volume_segment(first, transport)
    return sorted(
        (c for c in fits if _node_of(c.agent) != _node_of(first) and volume_segment(c.agent, transport) == segment),
        key=lambda c: (-c.free_bytes, c.agent.name),
    )


def partner_for(first: AgentEntry, candidates: Sequence[Candidate], size: int, transport: str) -> AgentEntry:
    """The second replica's agent for a pair whose first is ``first`` (as :func:`place_pair` pairs them);
    ``ResourceExhausted`` saying why when none has room."""
    fits = [c for c in candidates if transport in c.agent.transports and c.free_bytes >= size]
    found = _partners(first, fits, transport)
    if not found:
        raise ResourceExhausted(
            f"replicas 2: no agent on another storage node with {first.name}'s fabric and zone offers {transport} "
            f"with {size} bytes free"
        )
    return found[0].agent


def could_hold(
    entry: AgentEntry, transport: str, requirement: TopologyRequirement | None, source: ContentSource | None
) -> bool:
    """Could a CreateVolume with these arguments have put its volume on ``entry``?"""
    if source is not None:
        return entry.name == source.ref.location
    if transport not in entry.transports:
        return False
    if requirement is None or not requirement.requisite:
        return True
    return any(reachable(entry, transport, segment) for segment in requirement.requisite)


def source_agent(
    entry: AgentEntry | None, source: ContentSource, transport: str, requirement: TopologyRequirement | None
) -> AgentEntry:
    """The agent of a clone or a volume from a snapshot: its source's (``entry``; ``None``: the map does not
    list it), which the requested topology must reach."""
    if entry is None:
        raise NotFound(f"{source.kind} {source.ref.uuid} does not exist (unknown agent {source.ref.location})")
    if requirement and requirement.requisite and not any(reachable(entry, transport, t) for t in requirement.requisite):
        raise ResourceExhausted(f"the {source.kind} lives on {entry.name}, which the requested topology cannot reach")
    return entry
