"""A volume's condition as the controller reports it (ControllerGetVolume, ListVolumes), from what its agents say.

Contract: :func:`side_view` asks one agent (Health, then GetVolume) and never raises for an agent that cannot be
reached (``reachable`` False). :func:`condition_of` turns the views into the CSI condition:

- one copy: unreachable -> inaccessible; not ready -> degraded; then the agent's own issues (``agent/health.py``);
- a replicated volume: each replica's issues prefixed with its agent; a replica whose agent cannot be reached is
  *degraded* while the other replica is a reachable primary (the volume is served), *inaccessible* otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvmeof_csi.agentclient.api import AgentApi
from nvmeof_csi.errors import NotFound, Unavailable
from nvmeof_csi.service.contracts import Condition, Problem
from nvmeof_csi.topology.fabric_map import AgentEntry


@dataclass(frozen=True)
class SideView:
    agent: str
    reachable: bool
    problems: tuple[Problem, ...] = ()
    role: str = ""  # a replica's role ("" for one copy)
    peer_agent: str = ""


def side_view(entry: AgentEntry, client: AgentApi, vol_uuid: str) -> SideView:
    """What ``entry`` says of its copy of ``vol_uuid``."""
    try:
        health = client.health()
        vol = client.get_volume(vol_uuid)
    except Unavailable as err:
        message = f"agent {entry.name} unreachable: {err}"
        return SideView(entry.name, False, (Problem("inaccessible", "AgentUnreachable", message),))
    except NotFound:
        message = f"agent {entry.name} holds no copy of volume {vol_uuid}"
        return SideView(entry.name, True, (Problem("data-loss", "ReplicaMissing", message),))
    problems = [Problem(i.status, i.reason, i.message) for i in vol.health]
    if not health.ready:
        problems.append(Problem("degraded", "AgentNotReady", f"agent {entry.name} not ready: {health.message}"))
    return SideView(entry.name, True, tuple(problems), vol.replica.role, vol.replica.peer_agent)


def condition_of(views: list[SideView]) -> Condition:
    """The condition of a volume from its one view, or its two replicas' (see the module's contract)."""
    if len(views) == 1:
        problems = list(views[0].problems)
        if not problems:
            return Condition(False, f"ready on agent {views[0].agent}")
        return Condition(True, "; ".join(p.message for p in problems), tuple(problems))
    problems = []
    for view, other in ((views[0], views[1]), (views[1], views[0])):
        served = other.reachable and other.role == "primary"
        for p in view.problems:
            status = "degraded" if served and p.status == "inaccessible" else p.status
            problems.append(Problem(status, p.reason, f"replica on {view.agent}: {p.message}"))
    if not problems:
        return Condition(False, f"ready on agents {views[0].agent} and {views[1].agent}")
    return Condition(True, "; ".join(p.message for p in problems), tuple(problems))


__all__ = ["SideView", "condition_of", "side_view"]
