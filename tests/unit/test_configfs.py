"""The nvmet configfs model against a temp tree."""

from pathlib import Path

import pytest

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.errors import FailedPrecondition, InvalidArgument
from tests.support.agents import plain_configfs

NQN = "nqn.2026-11.io.nvmeof:vol:1"
HOST = "nqn.2014-08.org.nvmexpress:uuid:aaaa"


@pytest.fixture
def nvmet(tmp_path: Path) -> Nvmet:
    return Nvmet(plain_configfs(tmp_path), plain_tree=True)


def test_subsystem_namespace_and_links(nvmet: Nvmet) -> None:
    nvmet.ensure_subsystem(NQN, "serial1", "nvmeof-csi")
    nvmet.ensure_namespace(
        NQN, 1, "/pool/v.img", "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
    )
    port = PortSpec(1, "tcp", "127.0.0.1", 4420)
    nvmet.ensure_port(port)
    nvmet.link(1, NQN)
    nvmet.ensure_host(HOST)
    nvmet.allow(NQN, HOST)
    dump = nvmet.dump()
    sub = dump["subsystems"][NQN]
    assert sub["allow_any_host"] == "0" and sub["hosts"] == [HOST]
    assert sub["namespaces"]["1"] == {
        "device_path": "/pool/v.img",
        "device_uuid": "11111111-1111-1111-1111-111111111111",
        "device_nguid": "22222222-2222-2222-2222-222222222222",
        "enable": "1",
    }
    assert dump["ports"]["1"] == {
        "addr": ["tcp", "127.0.0.1", "4420"],
        "tls": False,
        "subsystems": [NQN],
        "ana": "optimized",
    }


def test_converging_twice_writes_nothing(nvmet: Nvmet, tmp_path: Path) -> None:
    args = (NQN, 1, "/pool/v.img", "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222")
    nvmet.ensure_subsystem(NQN, "s", "m")
    nvmet.ensure_namespace(*args)
    enable = tmp_path / "subsystems" / NQN / "namespaces" / "1" / "enable"
    before = enable.stat().st_mtime_ns
    nvmet.ensure_subsystem(NQN, "s", "m")
    nvmet.ensure_namespace(*args)
    assert enable.stat().st_mtime_ns == before


def test_whole_nqn_matching_never_touches_a_prefix_sibling(nvmet: Nvmet) -> None:
    for nqn in ("nqn.x:vol1", "nqn.x:vol10"):
        nvmet.ensure_subsystem(nqn, "s", "m")
        nvmet.ensure_port(PortSpec(1, "tcp", "127.0.0.1", 4420))
        nvmet.link(1, nqn)
    nvmet.remove_subsystem("nqn.x:vol1")
    assert nvmet.subsystems() == ["nqn.x:vol10"]
    assert nvmet.linked(1) == ["nqn.x:vol10"]


def test_port_address_change_relinks(nvmet: Nvmet) -> None:
    nvmet.ensure_subsystem(NQN, "s", "m")
    nvmet.ensure_port(PortSpec(1, "tcp", "127.0.0.1", 4420))
    nvmet.link(1, NQN)
    nvmet.ensure_port(PortSpec(1, "tcp", "127.0.0.9", 4430))
    assert nvmet.dump()["ports"]["1"]["addr"] == ["tcp", "127.0.0.9", "4430"]
    assert nvmet.linked(1) == [NQN]


def test_ana_and_hosts(nvmet: Nvmet) -> None:
    nvmet.ensure_port(PortSpec(1, "tcp", "127.0.0.1", 4420))
    assert nvmet.set_ana(1, "inaccessible") and not nvmet.set_ana(1, "inaccessible")
    assert nvmet.ana_state(1) == "inaccessible"
    with pytest.raises(InvalidArgument):
        nvmet.set_ana(1, "sideways")
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_TARGET_AUTH"):
        nvmet.ensure_host(HOST, "DHHC-1:00:abc:")
    nvmet.ensure_subsystem(NQN, "s", "m")
    nvmet.allow(NQN, HOST)
    nvmet.remove_host(HOST)  # still allowed: kept
    assert nvmet.hosts() == [HOST]
    nvmet.deny(NQN, HOST)
    nvmet.remove_host(HOST)
    assert nvmet.hosts() == []


def test_dhchap_secret_written_when_supported(nvmet: Nvmet, tmp_path: Path) -> None:
    (tmp_path / "hosts" / HOST).mkdir()
    (tmp_path / "hosts" / HOST / "dhchap_key").write_text("")
    nvmet.ensure_host(HOST, "DHHC-1:00:abc:", "DHHC-1:00:ctrl:")
    host = tmp_path / "hosts" / HOST
    assert (host / "dhchap_key").read_text() == "DHHC-1:00:abc:"
    assert (host / "dhchap_ctrl_key").read_text() == "DHHC-1:00:ctrl:"
    assert (host / "dhchap_hash").read_text() == "hmac(sha256)"
    assert (host / "dhchap_dhgroup").read_text() == "ffdhe2048"


def test_dhchap_support_probe_leaves_nothing(nvmet: Nvmet, tmp_path: Path) -> None:
    assert nvmet.supports_dhchap() is False  # a plain folder has no dhchap_key attribute
    assert nvmet.hosts() == []  # the probe entry is gone again


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("1:tcp:127.0.0.1:4420", PortSpec(1, "tcp", "127.0.0.1", 4420, "a")),
        ("3:rdma:169.254.77.1:4420:b", PortSpec(3, "rdma", "169.254.77.1", 4420, "b")),
        ("4:tcp:[fd00::1]:4420:c", PortSpec(4, "tcp", "fd00::1", 4420, "c")),
    ],
)
def test_portal_parse(text: str, spec: PortSpec) -> None:
    assert PortSpec.parse(text) == spec


@pytest.mark.parametrize("text", ["1:fc:a:1", "x:tcp:a:1", "1:tcp:a", "1:tcp:a:99999"])
def test_portal_parse_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument):
        PortSpec.parse(text)


def test_an_agent_with_a_cntlid_window_gives_its_subsystems_that_window_in_an_order_the_kernel_takes(
    tmp_path: Path,
) -> None:
    """Two agents exposing one subsystem (a replicated volume) need disjoint controller IDs: a host refuses a
    second controller with a cntlid it already has. The kernel refuses a min above the current max, so a window
    moved up writes max first."""
    root = plain_configfs(tmp_path)
    Nvmet(root, plain_tree=True).ensure_subsystem(NQN, "serial1", "m")  # made without a window: nothing written
    sub = root / "subsystems" / NQN
    assert not (sub / "attr_cntlid_min").exists()
    writes: list[str] = []
    windowed = Nvmet(root, plain_tree=True, cntlid=(1000, 1999))
    put = windowed._put

    def spy(path: object, value: str) -> None:
        writes.append(f"{str(path).rsplit('_', 1)[-1]}={value}")
        put(path, value)  # type: ignore[arg-type]

    windowed._put = spy  # type: ignore[method-assign]
    windowed.ensure_subsystem(NQN, "serial1", "m")
    assert writes == ["min=1000", "max=1999"]
    writes.clear()
    moved = Nvmet(root, plain_tree=True, cntlid=(3000, 3999))
    moved._put = spy  # type: ignore[method-assign]
    moved.ensure_subsystem(NQN, "serial1", "m")
    assert writes == ["max=3999", "min=3000"]  # min 3000 over the old max 1999 would be refused
    assert (sub / "attr_cntlid_min").read_text() == "3000" and (sub / "attr_cntlid_max").read_text() == "3999"
    writes.clear()
    moved.ensure_subsystem(NQN, "serial1", "m")
    assert writes == []  # idempotent


@pytest.mark.parametrize("window", ["0-100", "200-100", "1-65520", "a-b", "100"])
def test_a_malformed_cntlid_window_is_refused_at_start(window: str, tmp_path: Path) -> None:
    from nvmeof_csi.agent.portals import PortSpec
    from nvmeof_csi.cmd.agent_settings import AgentSettings
    from nvmeof_csi.errors import ConfigError

    fields = {
        "name": "a",
        "state_dir": tmp_path,
        "pool_dir": tmp_path,
        "portals": (PortSpec.parse("1:tcp:127.0.0.1:4420"),),
    }
    with pytest.raises(ConfigError, match="--cntlid-window"):
        AgentSettings(**fields, cntlid_window=window)  # type: ignore[arg-type]
    assert AgentSettings(**fields, cntlid_window="1-999").cntlid() == (1, 999)  # type: ignore[arg-type]
