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

from nvmeof_csi.backends.agent import AgentBackend
from nvmeof_csi.csi.params import parse
from nvmeof_csi.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from nvmeof_csi.initiator.fabrics import FabricsDevice, FabricsError
from nvmeof_csi.nvmeof.context import VolumeContext, parse_portals
from nvmeof_csi.nvmeof.dhchap import SECRET_KEY, HostKeys, derive, host_keys, parse_key
from nvmeof_csi.nvmeof.nqn import VOLUME_NQN_PREFIX as NQN_PREFIX
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.topology.fabric_map import parse_fabric_map
from tests.support.agents import LocalAgent, make_agent
from tests.unit.test_connector import ME, VOL, connector, ctx

SECRET = "a cluster-wide StorageClass secret of 32+ bytes!"
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


def test_host_keys_need_the_secret_and_never_show_it() -> None:
    assert host_keys("none", {}, HOST) == HostKeys()
    with pytest.raises(InvalidArgument, match=SECRET_KEY) as err:
        host_keys("dhchap", {"other": SECRET}, HOST, "node-stage secret")
    assert "node-stage secret" in str(err.value) and SECRET not in str(err.value)
    keys = host_keys("dhchap-bidirectional", {SECRET_KEY: SECRET}, HOST)
    assert keys.key == derive(SECRET, HOST) and keys.ctrl_key == derive(SECRET, HOST, "ctrl")
    assert keys.key != keys.ctrl_key and derive(SECRET, OTHER_HOST) != keys.key  # bound to the host and the role
    assert keys.key not in repr(keys) and keys.ctrl_key not in str(keys)
    parse_key(keys.key)


# -- the agent ------------------------------------------------------------------------------------------------
def test_agent_refuses_auth_volumes_on_a_kernel_without_nvmet_auth(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path, supported=False)
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_TARGET_AUTH"):
        agent.create_volume("v", 1 << 20, {"auth": "dhchap"}, {})
    assert agent.list_volumes() == [] and agent.nvmet.hosts() == []  # nothing saved, the probe entry is gone
    agent.create_volume("plain", 1 << 20, {}, {})  # auth: none works on every kernel


def test_agent_writes_host_keys_and_keeps_them_owner_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    agent = auth_agent(tmp_path)
    vol = agent.create_volume("v", 1 << 20, {"auth": "dhchap-bidirectional"}, {}).record
    keys = host_keys("dhchap-bidirectional", {SECRET_KEY: SECRET}, HOST)
    with pytest.raises(FailedPrecondition, match="no host key"):
        agent.allow_host(vol.uuid, HOST)
    with pytest.raises(FailedPrecondition, match="no controller key"):
        agent.allow_host(vol.uuid, HOST, keys.key)
    with pytest.raises(InvalidArgument, match="DH-HMAC-CHAP key"):
        agent.allow_host(vol.uuid, HOST, "DHHC-1:00:bm90IGEga2V5:", ctrl_secret=keys.ctrl_key)
    agent.allow_host(vol.uuid, HOST, keys.key, ctrl_secret=keys.ctrl_key)
    agent.allow_host(vol.uuid, HOST, keys.key, ctrl_secret=keys.ctrl_key)  # idempotent
    host = agent.nvmet.root / "hosts" / HOST
    assert (host / "dhchap_key").read_text() == keys.key and (host / "dhchap_ctrl_key").read_text() == keys.ctrl_key
    assert (host / "dhchap_hash").read_text() == "hmac(sha256)"
    state = agent.state.folder / "volumes" / f"{vol.uuid}.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    doc = json.loads(state.read_text())
    assert doc["hosts"] == {HOST: keys.key} and doc["ctrl_keys"] == {HOST: keys.ctrl_key}
    assert keys.key not in caplog.text and keys.ctrl_key not in caplog.text
    agent.deny_host(vol.uuid, HOST)
    assert agent.state.current.volumes[vol.uuid].ctrl_keys == {} and not host.exists()


def test_one_host_cannot_mix_keys_across_volumes(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path)
    a = agent.create_volume("a", 1 << 20, {"auth": "dhchap"}, {}).record
    b = agent.create_volume("b", 1 << 20, {"auth": "dhchap"}, {}).record
    plain = agent.create_volume("plain", 1 << 20, {}, {}).record
    key = derive(SECRET, HOST)
    agent.allow_host(a.uuid, HOST, key)
    agent.allow_host(b.uuid, HOST, key)  # same secret: fine
    with pytest.raises(FailedPrecondition, match="same auth mode and secret") as err:
        agent.allow_host(plain.uuid, HOST)  # nvmet would demand the key for the plain volume too
    assert key not in str(err.value)
    other = derive("another secret, also at least 32 bytes", HOST)
    agent.deny_host(b.uuid, HOST)
    with pytest.raises(FailedPrecondition, match="other DH-HMAC-CHAP keys"):
        agent.allow_host(b.uuid, HOST, other)  # would lock volume a's reconnects out
    with pytest.raises(InvalidArgument, match="auth 'none'"):
        agent.allow_host(plain.uuid, OTHER_HOST, key)
    agent.deny_host(a.uuid, HOST)
    agent.allow_host(plain.uuid, HOST)  # nothing else holds the host any more


def test_controller_publish_derives_this_nodes_keys(tmp_path: Path) -> None:
    agent = auth_agent(tmp_path)
    fabric = parse_fabric_map({"agents": [{"name": "store-a", "endpoint": "unix:///nowhere", "fabric": "f1"}]})
    backend = AgentBackend(fabric, client=lambda _entry: LocalAgent(agent))
    vol = agent.create_volume("v", 1 << 20, {"auth": "dhchap"}, {}).record
    ref = VolumeRef("store-a", vol.uuid)
    with pytest.raises(InvalidArgument, match="controller-publish secret"):
        backend.publish(ref, HOST, False)
    backend.publish(ref, HOST, False, {SECRET_KEY: SECRET})
    assert agent.state.current.volumes[vol.uuid].hosts == {HOST: derive(SECRET, HOST)}
    assert backend.get_volume(ref).context["auth"] == "dhchap"  # type: ignore[union-attr]


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


def test_node_connects_with_its_own_derived_keys_and_no_argv(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    keys = host_keys("dhchap-bidirectional", {SECRET_KEY: SECRET}, ME.nqn)
    fab = FakeFabrics(fake._add, keys)
    conn._fabrics = fab
    context = ctx(VOL, auth="dhchap-bidirectional", queueSize="64")
    with pytest.raises(InvalidArgument, match="node-stage secret"):
        conn.connect(VOL, context, 30)
    assert conn.connect(VOL, context, 30, {SECRET_KEY: SECRET}) == "/dev/nvme0n1"
    assert fake.argvs == []  # no nvme-cli: no key on any command line
    first = fab.writes[0]
    assert first["hostnqn"] == ME.nqn and first["hostid"] == ME.host_id and first["queue_size"] == "64"
    assert first["keep_alive_tmo"] == "5" and first["dhchap_ctrl_secret"] == keys.ctrl_key
    assert conn.reconcile([(VOL, context)], 30) == []  # no secret at start-up: the kernel keeps its keys


def test_node_reports_a_rejected_key_and_an_old_kernel(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    right = host_keys("dhchap", {SECRET_KEY: SECRET}, ME.nqn)
    conn._fabrics = FakeFabrics(fake._add, right)
    wrong = {SECRET_KEY: "not the StorageClass secret, 32 bytes long"}
    with pytest.raises(PermissionDenied, match="refused DH-HMAC-CHAP") as err:
        conn.connect(VOL, ctx(VOL, auth="dhchap"), 30, wrong)
    assert host_keys("dhchap", wrong, ME.nqn).key not in str(err.value)
    conn._fabrics = FakeFabrics(fake._add, right, host_auth=False)
    with pytest.raises(FailedPrecondition, match="CONFIG_NVME_HOST_AUTH"):
        conn.connect(VOL, ctx(VOL, auth="dhchap"), 30, {SECRET_KEY: SECRET})


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
