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
