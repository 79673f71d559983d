"""DH-HMAC-CHAP end to end on fakes: StorageClass ``auth`` -> agent records and configfs attributes ->
controller-publish key derivation -> the node's connect through ``/dev/nvme-fabrics`` (never argv). The real
kernel proves the same in the lab (tests/lab_driver/test_auth_lab.py, tests/lab/test_old_kernel.py)."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from nvmeof_csi.agentclient.limits import AgentClients, AgentHostKeys
from nvmeof_csi.csi.params import parse
from nvmeof_csi.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from nvmeof_csi.fleet.backend import AgentBackend
from nvmeof_csi.initiator.fabrics import FabricsDevice, FabricsError
from nvmeof_csi.nvmeof.context import VolumeContext, parse_portals
from nvmeof_csi.nvmeof.dhchap import HostKeys, generate_key, parse_key
from nvmeof_csi.nvmeof.nqn import VOLUME_NQN_PREFIX as NQN_PREFIX
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.topology.fabric_map import AgentEntry, parse_fabric_map
from tests.support.agents import LocalAgent, make_agent
from tests.unit.test_connector import ME, VOL, connector, ctx

HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"
OTHER_HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000002"


def auth_agent(tmp: Path, supported: bool = True):  # type: ignore[no-untyped-def]
    agent = make_agent(tmp)
    agent.converge()
    if supported:  # the attribute CONFIG_NVME_TARGET_AUTH gives every host entry (a plain folder has none)
        for nqn in (HOST, OTHER_HOST):
            (agent.nvmet.root / "hosts" / nqn).mkdir(parents=True, exist_ok=True)
            (agent.nvmet.root / "hosts" / nqn / "dhchap_key").write_text("")
    return agent


# -- StorageClass and volume context ------------------------------------------------------------------------
def test_auth_parameter_is_validated_and_travels_in_the_volume_context() -> None:
    assert parse({"auth": "dhchap-bidirectional"}).auth == "dhchap-bidirectional"
    assert parse({}).auth == "none"
    with pytest.raises(InvalidArgument, match="'auth' must be one of"):
        parse({"auth": "chap"})
    vc = VolumeContext(NQN_PREFIX + VOL.uuid, VOL.uuid, "tcp", parse_portals("tcp:127.0.0.1:4420"), auth="dhchap")
    assert VolumeContext.from_dict(vc.to_dict()) == vc
    assert "auth" not in VolumeContext(vc.nqn, VOL.uuid, "tcp", vc.portals).to_dict()
    with pytest.raises(InvalidArgument, match="'auth'"):
        VolumeContext.from_dict({**vc.to_dict(), "auth": "dhchap\n"})


def test_host_keys_never_show_a_key() -> None:
    keys = HostKeys(generate_key(), generate_key())
    assert keys.key not in repr(keys) and keys.ctrl_key not in str(keys)
    parse_key(keys.key)


# -- the agent ------------------------------------------------------------------------------------------------
def test_agent_refuses_auth_volumes_on_a_kernel_without_nvmet_auth(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path, supported=False)
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_TARGET_AUTH"):
        agent.create_volume("v", 1 << 20, VolumeParameters.parse({"auth": "dhchap"}), {})
    assert agent.list_volumes() == [] and agent.nvmet.hosts() == []  # nothing saved, the probe entry is gone
    agent.create_volume("plain", 1 << 20, VolumeParameters.parse({}), {})  # auth: none works on every kernel


def test_agent_issues_random_host_keys_and_keeps_them_owner_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    agent = auth_agent(tmp_path)
    vol = agent.create_volume("v", 1 << 20, VolumeParameters.parse({"auth": "dhchap-bidirectional"}), {}).record
    with pytest.raises(InvalidArgument, match="DH-HMAC-CHAP key"):
        agent.allow_host(vol.uuid, HOST, "DHHC-1:00:bm90IGEga2V5:")
    agent.allow_host(vol.uuid, HOST)  # no keys given: the agent issues them
    key, ctrl_key, _ = agent.host_keys(vol.uuid, HOST)
    assert parse_key(key) and parse_key(ctrl_key) and key != ctrl_key
    agent.allow_host(vol.uuid, HOST)  # idempotent: the same keys
    assert agent.host_keys(vol.uuid, HOST) == (key, ctrl_key, "")
    host = agent.nvmet.root / "hosts" / HOST
    assert (host / "dhchap_key").read_text() == key and (host / "dhchap_ctrl_key").read_text() == ctrl_key
    assert (host / "dhchap_hash").read_text() == "hmac(sha256)"
    state = agent.state.folder / "volumes" / f"{vol.uuid}.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    doc = json.loads(state.read_text())
    assert doc["hosts"] == {HOST: key} and doc["ctrl_keys"] == {HOST: ctrl_key}
    assert key not in caplog.text and ctrl_key not in caplog.text
    with pytest.raises(NotFound):
        agent.host_keys(vol.uuid, OTHER_HOST)  # not allowed: no keys
    agent.deny_host(vol.uuid, HOST)
    assert agent.state.current.volumes[vol.uuid].ctrl_keys == {} and not host.exists()


def test_each_host_gets_its_own_keys_the_same_on_every_volume_and_cannot_mix(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path)
    a = agent.create_volume("a", 1 << 20, VolumeParameters.parse({"auth": "dhchap"}), {}).record
    b = agent.create_volume("b", 1 << 20, VolumeParameters.parse({"auth": "dhchap"}), {}).record
    plain = agent.create_volume("plain", 1 << 20, VolumeParameters.parse({}), {}).record
    agent.allow_host(a.uuid, HOST)
    agent.allow_host(b.uuid, HOST)
    agent.allow_host(b.uuid, OTHER_HOST)
    key = agent.host_keys(a.uuid, HOST)[0]
    assert agent.host_keys(b.uuid, HOST)[0] == key  # nvmet keeps one key per host
    assert agent.host_keys(b.uuid, OTHER_HOST)[0] != key  # random per host: nothing links them
    with pytest.raises(FailedPrecondition, match="same auth mode and secret") as err:
        agent.allow_host(plain.uuid, HOST)  # nvmet would demand the key for the plain volume too
    assert key not in str(err.value)
    agent.deny_host(b.uuid, HOST)
    with pytest.raises(FailedPrecondition, match="other DH-HMAC-CHAP keys"):
        agent.allow_host(b.uuid, HOST, generate_key())  # would lock volume a's reconnects out
    with pytest.raises(InvalidArgument, match="auth 'none'"):
        agent.allow_host(plain.uuid, "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000003", key)
    agent.deny_host(a.uuid, HOST)
    agent.allow_host(plain.uuid, HOST)  # nothing else holds the host any more


def test_controller_publish_needs_no_secret_and_the_node_fetches_only_its_own_keys(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path)
    fabric = parse_fabric_map({"agents": [{"name": "store-a", "endpoint": "unix:///nowhere", "fabric": "f1"}]})
    backend = AgentBackend(fabric, client=lambda _entry: LocalAgent(agent))
    vol = agent.create_volume("v", 1 << 20, VolumeParameters.parse({"auth": "dhchap"}), {}).record
    ref = VolumeRef("store-a", vol.uuid)
    backend.publish(ref, HOST, False, node_name="gpu-1")
    issued = agent.state.current.volumes[vol.uuid].hosts[HOST]
    assert agent.state.current.volumes[vol.uuid].host_nodes == {HOST: "gpu-1"}  # the grant names the host's Node
    backend.publish(ref, HOST, False)  # a grant that names no Node keeps the one recorded
    assert agent.state.current.volumes[vol.uuid].host_nodes == {HOST: "gpu-1"}
    assert backend.get_volume(ref).context["auth"] == "dhchap"  # type: ignore[union-attr]
    fetch = AgentHostKeys(AgentClients(fabric, lambda _entry: LocalAgent(agent)), HOST)
    assert fetch(ref) == HostKeys(issued)
    with pytest.raises(NotFound):
        AgentHostKeys(AgentClients(fabric, lambda _entry: LocalAgent(agent)), OTHER_HOST)(ref)
    with pytest.raises(FailedPrecondition, match="fabric map"):
        fetch(VolumeRef("store-b", vol.uuid))


# -- the node ---------------------------------------------------------------------------------------------------
class FakeFabrics(FabricsDevice):
    """/dev/nvme-fabrics over the connector test's fake kernel; ``expect`` is the key the target accepts."""

    def __init__(self, add: object, expect: HostKeys, host_auth: bool = True) -> None:
        super().__init__(Path("/nonexistent"))
        self.add, self.expect, self.host_auth = add, expect, host_auth
        self.writes: list[dict[str, str | None]] = []

    def authenticates(self) -> bool:
        return self.host_auth

    def connect(self, options: Sequence[tuple[str, str | None]]) -> str:
        opts = dict(options)
        self.writes.append(opts)
        if (opts.get("dhchap_secret"), opts.get("dhchap_ctrl_secret", "")) != (self.expect.key, self.expect.ctrl_key):
            raise FabricsError(errno.EKEYREJECTED, "EKEYREJECTED: Key was rejected by service")
        self.add(opts["transport"], opts["traddr"], opts["trsvcid"], opts["nqn"])  # type: ignore[operator]
        return "nvme0"


def test_node_connects_with_the_keys_its_agent_issued_and_no_argv(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    keys = HostKeys(generate_key(), generate_key())
    fab = FakeFabrics(fake._add, keys)
    conn._fabrics = fab
    context = ctx(VOL, auth="dhchap-bidirectional", queueSize="64")
    with pytest.raises(FailedPrecondition, match="fabric map"):
        conn.connect(VOL, context, 30)  # no way to fetch keys
    asked: list[VolumeRef] = []

    def fetch(ref: VolumeRef) -> HostKeys:
        asked.append(ref)
        return keys

    conn._host_keys = fetch
    assert conn.connect(VOL, context, 30) == "/dev/nvme0n1"
    assert asked[0] == VOL  # the volume ID's agent, never a context's
    assert fake.argvs == []  # no nvme-cli: no key on any command line
    first = fab.writes[0]
    assert first["hostnqn"] == ME.nqn and first["hostid"] == ME.host_id and first["queue_size"] == "64"
    assert first["keep_alive_tmo"] == "5" and first["dhchap_ctrl_secret"] == keys.ctrl_key
    assert conn.reconcile([(VOL, context)], 30) == []  # at start-up the kernel keeps its keys


def test_node_reports_a_rejected_key_and_an_old_kernel(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    right, wrong = HostKeys(generate_key()), HostKeys(generate_key())
    conn._fabrics = FakeFabrics(fake._add, right)
    conn._host_keys = lambda _ref: wrong
    with pytest.raises(PermissionDenied, match="refused DH-HMAC-CHAP") as err:
        conn.connect(VOL, ctx(VOL, auth="dhchap"), 30)
    assert wrong.key not in str(err.value)
    conn._fabrics = FakeFabrics(fake._add, right, host_auth=False)
    conn._host_keys = lambda _ref: right
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_HOST_AUTH"):
        conn.connect(VOL, ctx(VOL, auth="dhchap"), 30)


def test_fabrics_device_errors_never_carry_the_options(tmp_path: Path) -> None:
    dev = tmp_path / "nvme-fabrics"
    dev.write_text("instance=-1,cntlid=-1,transport=%s,dhchap_secret=%s,duplicate_connect\n")
    fabrics = FabricsDevice(dev)
    assert {"transport", "dhchap_secret", "duplicate_connect"} <= fabrics.options()
    assert FabricsDevice(tmp_path / "missing").options() == frozenset()
    sys_root, modules = tmp_path / "sys", tmp_path / "modules"
    probe = FabricsDevice(dev, sys_root, modules)
    assert not probe.authenticates()  # 6.1: the option is parsed, but there is no nvme-auth
    (modules / os.uname().release).mkdir(parents=True)
    (modules / os.uname().release / "modules.builtin").write_text("kernel/drivers/nvme/common/nvme-auth.ko\n")
    assert probe.authenticates()
    (sys_root / "module" / "nvme_auth").mkdir(parents=True)
    assert FabricsDevice(dev, sys_root, tmp_path / "none").authenticates()
    with pytest.raises(InvalidArgument, match="character"):
        fabrics.connect([("nqn", "a,hostnqn=evil")])
    dev.unlink()
    dev.mkdir()  # writing to a folder fails: the error names the errno only
    with pytest.raises(FabricsError) as err:
        fabrics.connect([("dhchap_secret", "DHHC-1:00:c2VjcmV0:")])
    assert "c2VjcmV0" not in str(err.value)


# -- key rotation ---------------------------------------------------------------------------------------------
def test_rotating_a_host_key_changes_it_on_every_volume_and_in_configfs_one_key_at_a_time(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path)
    a = agent.create_volume("a", 1 << 20, VolumeParameters.parse({"auth": "dhchap-bidirectional"}), {}).record
    b = agent.create_volume("b", 1 << 20, VolumeParameters.parse({"auth": "dhchap-bidirectional"}), {}).record
    for vol in (a, b):
        agent.allow_host(vol.uuid, HOST)
    agent.allow_host(a.uuid, OTHER_HOST)
    key, ctrl_key, _ = agent.host_keys(a.uuid, HOST)
    other = agent.host_keys(a.uuid, OTHER_HOST)
    assert sorted(agent.rotate_host_key(HOST)) == sorted([a.uuid, b.uuid])
    new_key, same_ctrl, _ = agent.host_keys(a.uuid, HOST)
    assert new_key != key and same_ctrl == ctrl_key and agent.host_keys(b.uuid, HOST) == (new_key, ctrl_key, "")
    assert (agent.nvmet.root / "hosts" / HOST / "dhchap_key").read_text() == new_key
    assert agent.host_keys(a.uuid, OTHER_HOST) == other  # another host's keys are untouched
    agent.rotate_host_key(HOST, controller_key=True)
    assert agent.host_keys(b.uuid, HOST)[0] == new_key and agent.host_keys(b.uuid, HOST)[1] != ctrl_key
    assert agent.converge().applied == []  # state and configfs agree
    with pytest.raises(NotFound):
        agent.rotate_host_key("nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000009")


def test_the_node_rolls_its_live_controllers_to_the_agents_current_keys(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    old, new = HostKeys(generate_key()), HostKeys(generate_key())
    current = [old]
    conn._fabrics = FakeFabrics(fake._add, old)
    conn._host_keys = lambda _ref: current[0]
    context = ctx(VOL, auth="dhchap")
    conn.connect(VOL, context, 30)
    ctrls = sorted((tmp_path / "class" / "nvme").iterdir())
    assert len(ctrls) == 2
    for ctrl in ctrls:  # what the kernel shows for a controller connected with a key: to everyone (0644)
        (ctrl / "dhchap_secret").write_text(old.key + "\n")
        (ctrl / "dhchap_secret").chmod(0o644)
    assert conn.refresh_keys(VOL, context) == []  # nothing changed: nothing written
    # the pass narrowed the keys to root only (before: any pod on the node, sysfs mounted read-only, read them)
    assert {oct((c / "dhchap_secret").stat().st_mode & 0o777) for c in ctrls} == {"0o600"}
    current[0] = new
    actions = conn.refresh_keys(VOL, context)
    assert len(actions) == 2 and all("re-authenticated with a new dhchap_secret" in a for a in actions)
    assert all(new.key not in a for a in actions)
    assert all((c / "dhchap_secret").read_text() == new.key for c in ctrls)
    assert conn.refresh_keys(VOL, ctx(VOL)) == []  # auth none: no keys to roll


def test_a_rotation_a_killed_agent_left_half_done_is_finished_at_start(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path)
    vols = [agent.create_volume(n, 1 << 20, VolumeParameters.parse({"auth": "dhchap"}), {}).record for n in ("a", "b")]
    for vol in vols:
        agent.allow_host(vol.uuid, HOST)
    agent.allow_host(vols[0].uuid, OTHER_HOST)
    half = agent.state.current.volumes[vols[0].uuid]  # the kill: one record saved with the new key, not the other
    agent.state.put_volume(half.evolve(hosts={**half.hosts, HOST: generate_key()}))
    assert agent.host_keys(vols[0].uuid, HOST) != agent.host_keys(vols[1].uuid, HOST)
    other = agent.host_keys(vols[0].uuid, OTHER_HOST)
    assert agent.finish_rotations() == [f"{HOST} (key)"]
    key = agent.host_keys(vols[0].uuid, HOST)
    assert agent.host_keys(vols[1].uuid, HOST) == key
    assert (agent.nvmet.root / "hosts" / HOST / "dhchap_key").read_text() == key[0]
    assert agent.host_keys(vols[0].uuid, OTHER_HOST) == other and agent.finish_rotations() == []


def test_agent_clients_make_one_client_per_agent(tmp_path: Path) -> None:
    """The node's keys and its limits share one client (one channel) per agent, made on first use only."""
    agent = auth_agent(tmp_path)
    fabric = parse_fabric_map({"agents": [{"name": "store-a", "endpoint": "unix:///nowhere", "fabric": "f1"}]})
    made: list[str] = []

    def factory(entry: AgentEntry) -> LocalAgent:
        made.append(entry.name)
        return LocalAgent(agent)

    clients = AgentClients(fabric, factory)
    first = clients.for_agent("store-a")
    assert clients.for_agent("store-a") is first and clients.for_agent("store-b") is None
    assert made == ["store-a"]
