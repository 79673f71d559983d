"""DenyHost of a volume's last host ends that host's live connections, as a fence does (security round 3, #5):
before, a node that answered NodeUnstage without disconnecting kept reading and writing a volume after it had
been unpublished from it, since nvmet checks a host's grant only when it connects. With other hosts still on the
volume, a DenyHost never cycles its ports (they would all reconnect); the fence is the tool for that."""

from __future__ import annotations

from pathlib import Path

from nvmeof_csi.nvmeof.nqn import volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from tests.support.agents import make_agent

HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000d1"
OTHER = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-0000000000d2"


def test_deny_of_the_last_host_cycles_the_subsystems_port_links(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    vol = agent.create_volume("v", 1 << 20, VolumeParameters(), {}).record
    nqn = volume_nqn(vol.uuid)
    cycled: list[tuple[int, str]] = []
    unlink = agent.nvmet.unlink

    def spy(port: int, name: str) -> None:
        cycled.append((port, name))
        unlink(port, name)

    agent.nvmet.unlink = spy  # type: ignore[method-assign,assignment]
    for host in (HOST, OTHER):
        agent.allow_host(vol.uuid, host)
    agent.deny_host(vol.uuid, HOST)
    assert cycled == [], "another host is still on the volume: its ports stay as they are"
    agent.deny_host(vol.uuid, OTHER)
    assert cycled == [(1, nqn), (2, nqn)], "the last host's controllers were not ended"
    assert all(nqn in agent.nvmet.linked(port) for port in (1, 2)), "linked again for the next publish"
    cycled.clear()
    agent.deny_host(vol.uuid, OTHER)  # denied already: nothing to end
    assert cycled == []
