from pathlib import Path

import pytest

from nvmeof_csi.cmd.settings import Mode, Settings, parse_size
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.rpc.endpoints import Endpoint


@pytest.mark.parametrize(
    ("text", "scheme", "where"),
    [
        ("unix:///run/csi/csi.sock", "unix", "/run/csi/csi.sock"),
        ("tcp://127.0.0.1:10000", "tcp", "127.0.0.1:10000"),
        ("tcp://[::1]:5", "tcp", "[::1]:5"),
    ],
)
def test_endpoint_parse(text: str, scheme: str, where: str) -> None:
    ep = Endpoint.parse(text)
    assert ep.scheme == scheme
    assert where in ep.grpc_address
    assert str(ep) == text


@pytest.mark.parametrize("text", ["unix://relative.sock", "tcp://host", "tcp://h:70000", "http://x:1", "/tmp/x.sock"])
def test_endpoint_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        Endpoint.parse(text)


def _settings(**kw: object) -> Settings:
    base: dict[str, object] = {"mode": Mode.ALL, "endpoint": Endpoint.parse("unix:///tmp/x.sock")}
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("fabric", "Not_A_Label", "fabric"),
        ("loop_capacity_bytes", 0, "loop-capacity"),
        ("max_volumes_per_node", -1, "max-volumes-per-node"),
        ("grace_seconds", 0, "grace-seconds"),
        ("log_level", "LOUD", "log-level"),
        ("state_dir", Path("relative"), "state-dir"),
        ("node_id", "n" * 193, "node-id"),
    ],
)
def test_settings_reject_with_named_setting(field: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _settings(**{field: value})


def test_settings_default_node_id_is_hostname() -> None:
    import socket

    assert _settings().node_id == socket.gethostname()


@pytest.mark.parametrize(
    ("text", "value"), [("1", 1), ("4K", 4096), ("10G", 10 << 30), ("1Ti", 1 << 40), ("2MiB", 2 << 20)]
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_parse_size_rejects() -> None:
    with pytest.raises(ConfigError):
        parse_size("ten gigs")


def test_the_readme_configuration_table_is_the_one_the_declarations_make() -> None:
    from nvmeof_csi.cmd.flags import markdown_table
    from tests.support.env import ROOT

    table = markdown_table(Settings)
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert table in doc, f"docs/configuration.md's serve table differs; it should read:\n{table}"


def test_every_serve_flag_is_declared_once_with_its_variable_default_and_range() -> None:
    from typer.testing import CliRunner

    from nvmeof_csi.cmd.main import app

    shown = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "400"}).output
    for flag, env in (
        ("--qos-period", "NVMEOF_CSI_QOS_PERIOD"),
        ("--loop-capacity", "NVMEOF_CSI_LOOP_CAPACITY"),
        ("--grace-seconds", "NVMEOF_CSI_GRACE_SECONDS"),
    ):
        assert flag in shown and env in shown
    assert "Range: within 0.2..300." in shown and "default: 1T" in shown
    refused = CliRunner().invoke(app, ["serve", "--qos-period", "0.1"])
    assert refused.exit_code == 2 and "qos-period must be within 0.2..300, got 0.1" in refused.output


def test_the_readme_agent_table_is_the_one_the_declarations_make() -> None:
    from nvmeof_csi.cmd.agent_settings import AgentSettings
    from nvmeof_csi.cmd.flags import markdown_table
    from tests.support.env import ROOT

    table = markdown_table(AgentSettings)
    assert "configfs-plain-tree" not in table  # a test-only switch stays out of the docs
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert table in doc, f"docs/configuration.md's agent table differs; it should read:\n{table}"
