"""Endpoints and sockets: loopback is parsed, never prefix-matched; the agent's owner-only socket has its mode
from the first moment. (Holes a security review found; each test failed before its fix.)"""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

from nvmeof_csi.rpc.endpoints import Endpoint, is_loopback
from nvmeof_csi.rpc.server import bind, new_server


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("127.evil.example", False),
        ("127.0.0.1.nip.io", False),
        ("10.0.0.1", False),
        ("[::2]", False),
        ("", False),
    ],
)
def test_loopback_is_parsed_not_prefix_matched(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def test_owner_only_socket_has_its_mode_from_the_first_moment(tmp_path: pathlib.Path) -> None:
    """No window between bind and chmod in which another local user could connect to the agent's socket."""
    before = os.umask(0o022)
    os.umask(before)
    server = new_server({})
    bind(server, Endpoint.parse(f"unix://{tmp_path}/agent.sock"), socket_mode=0o600)
    assert stat.S_IMODE((tmp_path / "agent.sock").stat().st_mode) == 0o600  # before start(), before any chmod
    assert os.umask(before) == before  # the process umask is restored
    await server.stop(None)
