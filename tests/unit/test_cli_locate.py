"""nvmeofctl takes a volume however an operator has it in an incident: the CSI handle from a PV (it names the agent:
no --target), a UUID, or the CSI name (the PV's ``pvc-...``); with several targets a UUID or a name is looked for
on each. Before, a UUID and --target were needed, and a handle was refused."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from nvmeof_csi.agentclient.client import AgentTarget
from nvmeof_csi.cli.context import CliState
from nvmeof_csi.errors import ConfigError, InvalidArgument, NotFound
from nvmeof_csi.rpc.endpoints import Endpoint

VOL = "0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01"
HELD = {"store-b": {VOL: "pvc-11"}}  # agent -> its volumes (uuid -> CSI name)


class Located(CliState):
    """Targets store-a and store-b over stand-in clients; ``asked`` records each agent asked."""

    asked: list[str]

    @contextmanager
    def client(self, target: AgentTarget) -> Iterator[Any]:
        volumes = HELD.get(target.name, {})
        self.asked.append(target.name)

        def get_volume(vol_uuid: str = "", name: str = "") -> SimpleNamespace:
            for uuid, csi_name in volumes.items():
                if vol_uuid == uuid or name == csi_name:
                    return SimpleNamespace(uuid=uuid)
            raise NotFound("no such volume")

        yield SimpleNamespace(get_volume=get_volume)


def located() -> Located:
    targets = [AgentTarget(n, Endpoint.parse(f"unix:///run/{n}.sock")) for n in ("store-a", "store-b")]
    state = Located(targets=targets)
    state.asked = []
    return state


def test_a_handle_names_its_agent_and_no_agent_is_asked() -> None:
    state = located()
    target, uuid = state.locate(f"nvmeof-v1.store-b.{VOL}", None)
    assert (target.name, uuid, state.asked) == ("store-b", VOL, [])
    with pytest.raises(ConfigError, match="names agent 'store-b', not --target 'store-a'"):
        state.locate(f"nvmeof-v1.store-b.{VOL}", "store-a")
    with pytest.raises(ConfigError, match="no target named 'store-z'"):
        state.locate(f"nvmeof-v1.store-z.{VOL}", None)
    with pytest.raises(InvalidArgument, match="not a volume ID"):
        state.locate("nvmeof-v1.store-b.not-a-uuid", None)


def test_a_uuid_or_a_csi_name_is_looked_for_on_every_target() -> None:
    state = located()
    assert state.locate(VOL.upper(), None) == (state.targets[1], VOL)  # before: "several targets ... --target"
    assert state.asked == ["store-a", "store-b"]
    assert state.locate("pvc-11", None) == (state.targets[1], VOL)
    with pytest.raises(NotFound, match="'pvc-99' is on none of the targets \\(store-a, store-b\\)"):
        state.locate("pvc-99", None)
    state.asked.clear()
    assert state.locate(VOL, "store-a") == (state.targets[0], VOL)  # one target named: as before, no lookup
    assert state.asked == []
