"""NVMe/TCP TLS (``tls: psk``): the PSK's interchange form and identity, the StorageClass parameter, TLS portals,
the agent's per-host PSKs in its kernel keyring, and the node's keyring and connect option. The kernel parts
(nvmet's ``addr_tsas``, the ``.nvme`` keyring, tlshd) are proven in the lab (``tests/lab/test_tls.py``)."""

from __future__ import annotations

import errno
import stat
from pathlib import Path

import pytest

from nvmeof_csi.agent.health import volume_health
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.csi.params import parse
from nvmeof_csi.errors import FailedPrecondition, InvalidArgument
from nvmeof_csi.host.keyring import NvmeKeyring, handshake_daemon_running
from nvmeof_csi.initiator.keys import ConnectKeys
from nvmeof_csi.nvmeof.context import VolumeContext
from nvmeof_csi.nvmeof.dhchap import HostKeys
from nvmeof_csi.nvmeof.nqn import volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.nvmeof.tlspsk import format_psk, generate_psk, identity, parse_psk
from nvmeof_csi.service.contracts import VolumeRef
from tests.support.agents import make_agent
from tests.unit.test_connector import ME, VOL, connector, ctx

HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"
OTHER_HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000002"
TLS_PORTAL = PortSpec(3, "tcp", "127.0.0.1", 4430, "a", tls=True)
PROC_KEYS = "0ed1d911 I--Q---     1 perm 3b010000     0     0 user      other: 4\n{ring}"
RING = "2e570f63 I------     3 perm 1f1f0000     0     0 keyring   .nvme: empty\n"


class FakeKeyring(NvmeKeyring):
    """/proc/keys with (or without) a .nvme keyring; ``add_key`` recorded."""

    def __init__(self, tmp: Path, present: bool = True, refuse: int = 0) -> None:
        self.keys = tmp / "proc-keys"
        self.keys.write_text(PROC_KEYS.format(ring=RING if present else ""))
        self.added: dict[str, bytes] = {}
        self.dropped: list[str] = []
        self.refuse = refuse
        super().__init__(self.keys, self._add, self._drop)

    def _add(self, key_type: bytes, description: bytes, payload: bytes, ring: int) -> int:
        assert (key_type, ring) == (b"psk", 0x2E570F63)
        if self.refuse:
            raise OSError(self.refuse, "refused")
        self.added[description.decode()] = payload
        serial = 0x1000 + len(self.added)
        with self.keys.open("a") as proc:  # as /proc/keys shows a psk key: its description, then its length
            proc.write(f"{serial:08x} I--Q---     1 perm 3f010000     0     0 psk       {description.decode()}: 32\n")
        return serial

    def _drop(self, serial: int, ring: int) -> None:
        assert ring == 0x2E570F63
        lines = self.keys.read_text().splitlines(keepends=True)
        gone = [line for line in lines if int(line.split()[0], 16) == serial]
        assert len(gone) == 1
        self.dropped.append(gone[0].split(None, 8)[8].rsplit(": ", 1)[0])
        self.keys.write_text("".join(line for line in lines if line not in gone))

    def held(self) -> set[str]:
        """The PSK identities /proc/keys still shows."""
        rows = [line.split(None, 8) for line in self.keys.read_text().splitlines()]
        return {r[8].rsplit(": ", 1)[0] for r in rows if len(r) == 9 and r[7] == "psk"}


def test_psk_interchange_form_round_trips_and_refuses_damage_without_echoing() -> None:
    key = bytes(range(32))
    text = format_psk(key)
    assert text.startswith("NVMeTLSkey-1:01:") and parse_psk(text) == key
    assert parse_psk(generate_psk()) != parse_psk(generate_psk())
    damaged = text[:20] + ("A" if text[20] != "A" else "B") + text[21:]
    for bad in (damaged, text.replace(":01:", ":02:"), "NVMeTLSkey-1:01:!!:", format_psk(key)[:-6] + ":"):
        with pytest.raises(InvalidArgument) as err:
            parse_psk(bad)
        assert text[16:40] not in str(err.value)
    assert identity(HOST, "nqn.x:v") == f"NVMe0R01 {HOST} nqn.x:v"


def test_tls_parameter_is_validated_and_travels_in_the_volume_context() -> None:
    assert parse({"tls": "psk"}).tls == "psk" and parse({}).tls == "none"
    with pytest.raises(InvalidArgument, match="'tls' must be one of none, psk"):
        parse({"tls": "yes"})
    with pytest.raises(InvalidArgument, match="transport tcp only"):
        parse({"tls": "psk", "transport": "rdma"})
    doc = ctx(VOL, tls="psk")
    assert VolumeContext.from_dict(doc).tls == "psk" and VolumeContext.from_dict(doc).to_dict()["tls"] == "psk"
    assert "tls" not in VolumeContext.from_dict(ctx(VOL)).to_dict()


def test_a_tls_portal_is_tcp_only_and_parsed_from_its_sixth_field() -> None:
    assert PortSpec.parse("3:tcp:10.0.0.5:4430:a:tls") == PortSpec(3, "tcp", "10.0.0.5", 4430, "a", True)
    assert not PortSpec.parse("3:tcp:10.0.0.5:4430:a").tls
    with pytest.raises(InvalidArgument, match="NVMe/TCP portals only"):
        PortSpec.parse("3:rdma:10.0.0.5:4430:a:tls")
    with pytest.raises(InvalidArgument, match="GROUP"):
        PortSpec.parse("3:tcp:10.0.0.5:4430:a:clear")


def test_keyring_is_found_by_name_and_a_refusal_names_no_key(tmp_path: Path) -> None:
    ring = FakeKeyring(tmp_path)
    assert ring.serial() == 0x2E570F63 and ring.available()
    ring.put_psk("NVMe0R01 h s", b"k" * 32)
    assert ring.added == {"NVMe0R01 h s": b"k" * 32}
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_TCP_TLS"):
        FakeKeyring(tmp_path, present=False).serial()
    with pytest.raises(FailedPrecondition, match="EDQUOT") as err:
        FakeKeyring(tmp_path, refuse=errno.EDQUOT).put_psk("NVMe0R01 h s", b"k" * 32)
    assert "kkkk" not in str(err.value)


def test_handshake_daemon_is_a_process_named_tlshd(tmp_path: Path) -> None:
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "comm").write_text("sshd\n")
    assert not handshake_daemon_running(tmp_path)
    (tmp_path / "345").mkdir()
    (tmp_path / "345" / "comm").write_text("tlshd\n")
    assert handshake_daemon_running(tmp_path)


def tls_agent(tmp: Path, ring: NvmeKeyring | None = None, daemon: bool = True, tls_portal: bool = True) -> TargetAgent:
    base = make_agent(tmp)
    agent = TargetAgent(
        "store-a",
        base.nvmet,
        base._parts.store,
        base._parts.state,
        [*base._parts.portals, *([TLS_PORTAL] if tls_portal else [])],
        keyring=ring or FakeKeyring(tmp),
        handshake_daemon=lambda: daemon,
    )
    agent.converge()
    return agent


def test_agent_refuses_a_tls_volume_it_cannot_serve(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(FailedPrecondition, match="no TLS portal"):
        tls_agent(tmp_path / "a", tls_portal=False).create_volume(
            "v", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {}
        )
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_TARGET_TCP_TLS"):
        (tmp_path / "b").mkdir()
        tls_agent(tmp_path / "b", FakeKeyring(tmp_path / "b", present=False)).create_volume(
            "v", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {}
        )
    (tmp_path / "c").mkdir()
    with pytest.raises(FailedPrecondition, match="tlshd"):
        tls_agent(tmp_path / "c", daemon=False).create_volume("v", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {})
    (tmp_path / "d").mkdir()
    with pytest.raises(InvalidArgument, match="transport tcp only"):
        tls_agent(tmp_path / "d").create_volume(
            "v", 1 << 20, VolumeParameters.parse({"tls": "psk", "transport": "rdma"}), {}
        )


def test_agent_issues_one_psk_per_host_and_exports_tls_volumes_on_tls_portals_only(tmp_path: Path) -> None:
    ring = FakeKeyring(tmp_path)
    agent = tls_agent(tmp_path, ring)
    a = agent.create_volume("a", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {})
    b = agent.create_volume("b", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {})
    clear = agent.create_volume("c", 1 << 20, VolumeParameters.parse({}), {})
    assert [p.port_id for p, _ in a.portals] == [3] and [p.port_id for p, _ in clear.portals] == [1, 2]
    for vol in (a, b, clear):
        agent.allow_host(vol.record.uuid, HOST)
    agent.allow_host(a.record.uuid, OTHER_HOST)
    psk = agent.host_keys(a.record.uuid, HOST)[2]
    assert parse_psk(psk) and agent.host_keys(b.record.uuid, HOST)[2] == psk  # one PSK per host
    assert agent.host_keys(a.record.uuid, OTHER_HOST)[2] not in ("", psk)  # random per host
    assert agent.host_keys(clear.record.uuid, HOST)[2] == ""
    assert ring.added[identity(HOST, volume_nqn(a.record.uuid))] == parse_psk(psk)
    assert ring.added[identity(HOST, volume_nqn(b.record.uuid))] == parse_psk(psk)
    assert not any(volume_nqn(clear.record.uuid) in ident for ident in ring.added)
    ports = agent.nvmet.dump()["ports"]
    assert ports["3"]["tls"] and ports["3"]["subsystems"] == sorted(volume_nqn(v.record.uuid) for v in (a, b))
    assert ports["1"]["subsystems"] == ports["2"]["subsystems"] == [volume_nqn(clear.record.uuid)]
    state = [f for f in (tmp_path / "state").rglob("*") if f.is_file() and psk in f.read_text(errors="ignore")]
    assert state and all(stat.S_IMODE(f.stat().st_mode) & 0o077 == 0 for f in state)


def test_agent_after_a_reboot_puts_every_psk_back_and_unlinks_a_wrong_kind_portal(tmp_path: Path) -> None:
    agent = tls_agent(tmp_path, FakeKeyring(tmp_path))
    vol = agent.create_volume("a", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {})
    agent.allow_host(vol.record.uuid, HOST)
    agent.nvmet.link(1, volume_nqn(vol.record.uuid))  # exported in clear text by mistake
    fresh = FakeKeyring(tmp_path)  # the kernel's keyring after a reboot: empty
    again = tls_agent(tmp_path, fresh)
    assert fresh.added == {
        identity(HOST, volume_nqn(vol.record.uuid)): parse_psk(again.host_keys(vol.record.uuid, HOST)[2])
    }
    assert volume_nqn(vol.record.uuid) not in again.nvmet.dump()["ports"]["1"]["subsystems"]


class TlsFabrics:
    def __init__(self, options: frozenset[str]) -> None:
        self._options = options

    def options(self) -> frozenset[str]:
        return self._options

    def authenticates(self) -> bool:
        return True


def test_node_puts_its_psk_in_its_keyring_and_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    psk = generate_psk()
    fetched: list[VolumeRef] = []

    def fetch(ref: VolumeRef) -> HostKeys:
        fetched.append(ref)
        return HostKeys(tls_psk=psk)

    context = VolumeContext.from_dict(ctx(VOL, tls="psk"))
    ring = FakeKeyring(tmp_path)
    keys = ConnectKeys(TlsFabrics(frozenset({"tls"})), ME.nqn, fetch, ring, lambda: True)  # type: ignore[arg-type]
    assert keys.for_volume(VOL, context).tls_psk == psk and fetched == [VOL]
    assert ring.added == {identity(ME.nqn, context.nqn): parse_psk(psk)}
    old_kernel = ConnectKeys(TlsFabrics(frozenset({"nqn"})), ME.nqn, fetch, ring, lambda: True)  # type: ignore[arg-type]
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_TCP_TLS"):
        old_kernel.for_volume(VOL, context)
    no_daemon = ConnectKeys(TlsFabrics(frozenset({"tls"})), ME.nqn, fetch, ring, lambda: False)  # type: ignore[arg-type]
    with pytest.raises(FailedPrecondition, match="tlshd"):
        no_daemon.for_volume(VOL, context)
    none_issued = ConnectKeys(TlsFabrics(frozenset({"tls"})), ME.nqn, lambda _r: HostKeys(), ring, lambda: True)  # type: ignore[arg-type]
    with pytest.raises(FailedPrecondition, match="no TLS PSK"):
        none_issued.for_volume(VOL, context)


def test_node_connects_a_tls_volume_with_the_tls_option_and_no_key_in_it(tmp_path: Path) -> None:
    conn, _fake = connector(tmp_path)
    tls, clear = VolumeContext.from_dict(ctx(VOL, tls="psk")), VolumeContext.from_dict(ctx(VOL))
    options = conn._connect_options(tls.portals[0], tls, HostKeys(tls_psk=generate_psk()))
    assert ("tls", None) in options and not any("NVMeTLSkey" in str(v) for _k, v in options)
    assert ("tls", None) not in conn._connect_options(clear.portals[0], clear, HostKeys())


def test_volume_health_judges_each_volume_by_the_portals_of_its_kind(tmp_path: Path) -> None:
    """A clear volume is not degraded for not being on a TLS portal, nor a TLS volume for not being on a clear one;
    a TLS volume off one of its TLS portals is."""
    agent = tls_agent(tmp_path, FakeKeyring(tmp_path))
    clear = agent.create_volume("c", 1 << 20, VolumeParameters.parse({}), {})
    tls = agent.create_volume("t", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {})
    parts = agent._parts
    assert volume_health(parts, clear.record) == [] and volume_health(parts, tls.record) == []
    agent.nvmet.unlink(TLS_PORTAL.port_id, volume_nqn(tls.record.uuid))
    assert [i[1] for i in volume_health(parts, tls.record)] == ["NoPortLinked"]
    assert volume_health(parts, clear.record) == []


def test_psks_leave_the_agents_keyring_when_a_grant_ends(tmp_path: Path) -> None:
    """Before, a deny, a fence or a delete left the host's PSK in the kernel keyring until reboot (readable by root
    there, and root's key quota ran out)."""
    ring = FakeKeyring(tmp_path)
    agent = tls_agent(tmp_path, ring)
    vol = agent.create_volume("a", 1 << 20, VolumeParameters.parse({"tls": "psk"}), {}).record
    for host in (HOST, OTHER_HOST):
        agent.allow_host(vol.uuid, host)
    mine, theirs = identity(HOST, volume_nqn(vol.uuid)), identity(OTHER_HOST, volume_nqn(vol.uuid))
    assert {mine, theirs} <= ring.held()
    agent.deny_host(vol.uuid, HOST)
    assert mine not in ring.held() and theirs in ring.held()
    agent.fence_host(vol.uuid, OTHER_HOST, "OPERATOR")
    assert theirs not in ring.held()
    agent.allow_host(vol.uuid, HOST)
    assert mine in ring.held()
    agent.delete_volume(vol.uuid)
    assert ring.held() == set()


def test_the_node_drops_its_psk_from_the_keyring_when_it_disconnects(tmp_path: Path) -> None:
    ring = FakeKeyring(tmp_path)
    conn, _ = connector(tmp_path / "sys")
    conn._keyring = ring
    tls_ctx = ctx(VOL, tls="psk")
    ring.put_psk(identity(ME.nqn, tls_ctx["nqn"]), bytes(32))
    local_target = tmp_path / "sys" / "kernel/config/nvmet/subsystems" / tls_ctx["nqn"]
    local_target.mkdir(parents=True)  # this machine's own target exports it: one keyring, the key is its too
    conn.disconnect(VOL, tls_ctx, frozenset())
    assert ring.dropped == []
    local_target.rmdir()
    conn.disconnect(VOL, tls_ctx, frozenset())
    assert ring.held() == set() and ring.dropped == [identity(ME.nqn, tls_ctx["nqn"])]
