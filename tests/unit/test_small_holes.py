"""Small holes a security review found; each test failed before its fix."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from nvmeof_csi.errors import ConfigError, InvalidArgument
from nvmeof_csi.nvmeof.nqn import check_host_nqn, valid_host_nqn
from nvmeof_csi.rpc.endpoints import is_loopback
from nvmeof_csi.topology.fabric_map import parse_fabric_map

GOOD_NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.9.8.7", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("127.evil.example", False), ("127.0.0.1.nip.io", False), ("10.0.0.1", False), ("[::2]", False), ("", False)],
)
def test_loopback_is_parsed_not_prefix_matched(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("suffix", ["\n", "\x00", "\r", " "])
def test_host_nqn_pattern_is_anchored_at_the_end(suffix: str) -> None:
    assert valid_host_nqn(GOOD_NQN)
    assert not valid_host_nqn(GOOD_NQN + suffix)
    with pytest.raises(InvalidArgument):
        check_host_nqn(GOOD_NQN + suffix)


def agent(**fields: Any) -> dict[str, Any]:
    return {"agents": [{"name": "store-a", "endpoint": "tcp://127.0.0.1:9440", "fabric": "rack-1", **fields}]}


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"allowPlaintextLoopback": "false"}, "allowPlaintextLoopback"),  # bool("false") was True
        ({"transports": "tcp"}, "transports"),
        ({"zone": ["a", "b"]}, "'zone' must be a string"),
        ({"tls": {"cert": ["x"], "key": "k", "ca": "c"}}, "'cert' must be a string"),
        ({"tls": "yes"}, "tls must be a mapping"),
        ({"endpoint": 9440}, "'endpoint' must be a string"),
        ({"alluxiohost": "w1"}, "unknown field 'alluxiohost'"),
    ],
)
def test_fabric_map_field_types_are_checked(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_fabric_map(agent(**fields))


def test_request_values_cannot_forge_log_lines() -> None:
    import io
    import logging

    from nvmeof_csi.rpc import logctx

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logctx.ContextFilter())
    log = logging.getLogger("test.forge")
    log.addHandler(handler)
    log.propagate = False
    log.warning("volume %s deleted", "pvc-1\n2026-11-30 INFO nvmeof_csi forged line\x00")
    assert stream.getvalue().count("\n") == 1 and "\\n2026-11-30" in stream.getvalue()


def test_log_lines_keep_the_standard_time_text_and_format_their_arguments_once() -> None:
    import logging

    from nvmeof_csi.rpc import logctx

    class Counted:
        calls = 0

        def __str__(self) -> str:
            Counted.calls += 1
            return "pvc-1"

    ours, standard = logctx.Formatter(), logging.Formatter(logctx.FORMAT)
    for created in (1764633600.25, 1764633600.999, 1764633601.0, 1764633659.5):  # same second, then the next ones
        record = logging.LogRecord("nvmeof_csi.rpc", logging.INFO, __file__, 1, "volume %s deleted", (Counted(),),
                                   None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert logctx.ContextFilter().filter(record)
        line = ours.format(record)
        assert line == standard.format(record) and line.endswith("req=- vol=- volume pvc-1 deleted")
    assert Counted.calls == 4  # once per line, in the filter


async def test_owner_only_socket_has_its_mode_from_the_first_moment(tmp_path: pathlib.Path) -> None:
    """No window between bind and chmod in which another local user could connect to the agent's socket."""
    import os
    import stat

    from nvmeof_csi.rpc.endpoints import Endpoint
    from nvmeof_csi.rpc.server import bind, new_server

    before = os.umask(0o022)
    os.umask(before)
    server = new_server({})
    bind(server, Endpoint.parse(f"unix://{tmp_path}/agent.sock"), socket_mode=0o600)
    assert stat.S_IMODE((tmp_path / "agent.sock").stat().st_mode) == 0o600  # before start(), before any chmod
    assert os.umask(before) == before  # the process umask is restored
    await server.stop(None)
