"""A replicated volume's replica in the agent (``agent/replicas.py``, ``agent/replica_ops.py``): the device stack a
create makes, the three roles and the order each change takes, epochs, DRBD's refusal, restart and delete; on a
plain configfs tree with a stand-in for the kernel (losetup and drbdadm-84 against a model of ``/proc/drbd``).
The kernel's own behaviour is proven in ``tests/cluster/test_replication.py``."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from nvmeof_csi.agent.messages import volume_msg
from nvmeof_csi.agent.replica_spec import ReplicaSpec
from nvmeof_csi.agent.replicas import metadata_bytes
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.errors import Aborted, AlreadyExists, FailedPrecondition, InvalidArgument
from nvmeof_csi.nvmeof.nqn import volume_nqn
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from tests.support.agents import make_agent
from tests.support.drbd_kernel import Kernel, replicated_agent

MiB = 1 << 20
SECRET = "00112233445566778899aabbccddeeff"
PAIR = {
    "peer_agent": "storage-2",
    "peer_host": "storage-2",
    "peer_address": "10.0.1.3",
    "address": "10.0.1.2",
    "port": "7800",
    "minor": "11",
    "secret": SECRET,
}
NS = "namespaces"


def create(agent: TargetAgent, **changes: str) -> str:
    spec = ReplicaSpec.parse({**PAIR, **changes})
    return agent.create_volume("pvc-r", 64 * MiB, VolumeParameters.parse({}), {}, replica=spec).record.uuid


def namespace(agent: TargetAgent, vol: str) -> dict[str, str]:
    return dict(agent.nvmet.dump()["subsystems"][volume_nqn(vol)][NS]["1"])


def linked(agent: TargetAgent, vol: str) -> list[str]:
    return [p for p, seen in agent.nvmet.dump()["ports"].items() if volume_nqn(vol) in seen["subsystems"]]


def test_a_new_replica_is_a_drbd_device_on_a_loop_its_namespace_made_but_not_enabled(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    assert kernel.words()[:5] == ["--noheadings", "modprobe", "--find", "create-md", "up"]
    assert agent.store.volume_path(vol).stat().st_size == 64 * MiB + metadata_bytes(64 * MiB)
    assert (tmp_path / "links" / f"replica-{vol}").readlink() == Path("/dev/loop7")
    ns = namespace(agent, vol)
    assert ns["device_path"] == "/dev/drbd11" and ns.get("enable") != "1" and ns["device_uuid"] == vol
    assert sorted(linked(agent, vol)) == ["1", "2"]  # the host holds a path here, no namespace behind it
    assert create(agent) == vol  # a repeated create: the same volume
    with pytest.raises(AlreadyExists, match="replica pair"):
        create(agent, minor="12")


def test_promotion_of_a_new_pair_skips_its_initial_sync_then_presents_the_namespace(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    view = agent.set_replica_role(vol, "primary", 1)
    drbd = [w for w in kernel.words() if w not in ("--noheadings", "adjust")]
    assert drbd[-2:] == ["new-current-uuid", "primary"]
    assert namespace(agent, vol)["enable"] == "1" and sorted(linked(agent, vol)) == ["1", "2"]
    msg = volume_msg(view, agent.replica_state(view.record))
    assert (msg.replica.role, msg.replica.epoch, msg.replica.drbd_role, msg.replica.disk) == (
        "primary", 1, "Primary", "UpToDate",
    )  # fmt: skip
    assert SECRET not in str(msg)
    before = len(kernel.calls)
    agent.set_replica_role(vol, "primary", 1)  # repeated: DRBD is Primary already, nothing more is run
    assert [c for c in kernel.calls[before:] if c[-2] == "primary"] == []


def test_a_primary_steps_down_through_fenced_unlinked_before_its_namespace_goes(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    agent.set_replica_role(vol, "primary", 1)
    with pytest.raises(FailedPrecondition, match="through fenced"):
        agent.set_replica_role(vol, "secondary", 2)
    assert namespace(agent, vol)["enable"] == "1"
    agent.set_replica_role(vol, "fenced", 2)
    assert linked(agent, vol) == [] and namespace(agent, vol)["enable"] == "0"
    assert kernel.minor is not None and kernel.minor["ro"] == "Secondary"
    agent.set_replica_role(vol, "secondary", 3)  # the peer promoted meanwhile: the ports come back
    assert sorted(linked(agent, vol)) == ["1", "2"] and namespace(agent, vol)["enable"] == "0"
    with pytest.raises(Aborted, match="older"):
        agent.set_replica_role(vol, "primary", 2)


def test_a_primary_in_sync_hands_over_without_being_outdated_and_only_then(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    with pytest.raises(FailedPrecondition, match="only a primary in sync"):
        agent.set_replica_role(vol, "handover", 1)  # a secondary has nothing to hand over
    agent.set_replica_role(vol, "primary", 1)
    assert kernel.minor is not None
    kernel.minor.update(cs="WFConnection", pds="DUnknown")
    with pytest.raises(FailedPrecondition, match="WFConnection UpToDate/DUnknown"):
        agent.set_replica_role(vol, "handover", 2)  # its peer might lack writes: fenced or failover, not this
    assert namespace(agent, vol)["enable"] == "1" and sorted(linked(agent, vol)) == ["1", "2"]
    kernel.minor.update(cs="Connected", pds="UpToDate")
    agent.set_replica_role(vol, "handover", 2)
    assert linked(agent, vol) == [] and namespace(agent, vol)["enable"] == "0"
    assert (kernel.minor["ro"], kernel.minor["ds"]) == ("Secondary", "UpToDate") and "outdate" not in kernel.words()
    assert agent.volume_health(vol) == []  # unlinked and disabled by design while the peer takes over
    agent.set_replica_role(vol, "handover", 2)  # repeated: the same
    again = replicated_agent(tmp_path, kernel)  # an agent restarted mid-handover keeps the host's paths away
    assert linked(again, vol) == []
    again.set_replica_role(vol, "secondary", 2)  # the peer promoted: the ports come back, no namespace behind
    assert sorted(linked(again, vol)) == ["1", "2"] and namespace(again, vol)["enable"] == "0"


def test_a_fenced_replica_cut_off_from_its_peer_is_outdated(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    assert kernel.minor is not None
    kernel.minor.update(ds="UpToDate", cs="WFConnection")  # the replication link cut: the peer went on alone
    agent.set_replica_role(vol, "fenced", 1)
    assert kernel.words()[-1] == "outdate" and kernel.minor["ds"] == "Outdated"
    with pytest.raises(FailedPrecondition, match="cannot be primary"):
        agent.set_replica_role(vol, "primary", 2)


def test_a_fenced_replica_that_has_not_yet_seen_the_cut_is_outdated_and_reconnects(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    assert kernel.minor is not None
    kernel.minor["ds"] = "UpToDate"  # the peer lost this side and asked to fence it; this side still shows Connected
    agent.set_replica_role(vol, "fenced", 1)
    assert kernel.words()[-3:] == ["disconnect", "outdate", "connect"], kernel.words()
    assert (kernel.minor["ds"], kernel.minor["cs"]) == ("Outdated", "WFConnection")
    assert kernel.calls[-3][-4:-1] == ["--", "--force", "disconnect"]
    with pytest.raises(FailedPrecondition, match="cannot be primary"):
        agent.set_replica_role(vol, "primary", 2)


def test_drbd_refusing_an_outdated_replica_changes_nothing(tmp_path: Path) -> None:
    kernel = Kernel()
    kernel.peer_disk = "UpToDate"  # not a new pair: no initial sync to skip, this side Inconsistent
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    with pytest.raises(FailedPrecondition, match="cannot be primary"):
        agent.set_replica_role(vol, "primary", 1)
    assert agent.get_volume(vol).record.replica["role"] == "secondary"
    assert namespace(agent, vol).get("enable") != "1" and "new-current-uuid" not in kernel.words()


def test_after_a_restart_only_a_replica_the_kernel_holds_primary_is_enabled(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    agent.set_replica_role(vol, "primary", 1)
    kernel.minor = None  # the node rebooted: DRBD and configfs are empty, the record still says primary
    shutil.rmtree(tmp_path / "nvmet")
    again = replicated_agent(tmp_path, kernel)
    assert again.get_volume(vol).record.replica["role"] == "primary"
    assert "create-md" not in kernel.words()[-3:]  # the metadata of a ready volume is never made again
    assert namespace(again, vol).get("enable") != "1"  # only the controller promotes


def test_delete_takes_the_stack_down_in_order(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    agent.delete_volume(vol)
    assert kernel.minor is None and kernel.loops == {}
    assert not (tmp_path / "links" / f"replica-{vol}").exists() and not agent.store.volume_path(vol).exists()
    assert volume_nqn(vol) not in agent.nvmet.dump()["subsystems"]


def test_what_a_replicated_create_refuses(tmp_path: Path) -> None:
    plain = make_agent(tmp_path / "plain")
    plain.converge()
    with pytest.raises(FailedPrecondition, match="--replication-address"):
        create(plain)
    agent = replicated_agent(tmp_path / "r", Kernel())
    source = agent.create_volume("src", 8 * MiB, VolumeParameters.parse({}), {}).record.uuid
    with pytest.raises(FailedPrecondition, match="from a snapshot or a volume"):
        agent.create_volume("c", 64 * MiB, VolumeParameters.parse({}), {}, source_volume=source,
                            replica=ReplicaSpec.parse(PAIR))  # fmt: skip
    with pytest.raises(InvalidArgument, match="the controller makes the pair"):
        agent.create_volume("lone", 64 * MiB, VolumeParameters.parse({"replicas": "2"}), {})
    create(agent)
    for taken in ({"minor": PAIR["minor"], "port": "7801"}, {"minor": "12", "port": PAIR["port"]}):
        with pytest.raises(FailedPrecondition, match="is held by volume"):
            agent.create_volume("other", 64 * MiB, VolumeParameters.parse({}), {},
                                replica=ReplicaSpec.parse({**PAIR, **taken}))  # fmt: skip
    other = agent.create_volume("other", 64 * MiB, VolumeParameters.parse({"replicas": "2"}), {},
                                replica=ReplicaSpec.parse({**PAIR, "minor": "12", "port": "7801"}))  # fmt: skip
    assert other.record.parameters["replicas"] == "2"


def test_a_replica_spec_never_shows_its_secret() -> None:
    spec = ReplicaSpec.parse(PAIR)
    assert SECRET not in repr(spec) and SECRET not in str(spec) and spec.secret == SECRET


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"secret": "XYZ"}, "secret"),
        ({"peer_address": "storage-2"}, "peer_address"),
        ({"minor": "-1"}, "minor"),
        ({"port": "70000"}, "port"),
        ({"role": "boss"}, "role"),
        ({"peer_host": "../etc"}, "host names"),
        ({"extra": "1"}, "unknown"),
        ({"address": ""}, "address is required"),
    ],
)
def test_a_malformed_replica_is_refused_naming_the_field(change: dict[str, str], says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        ReplicaSpec.parse({**PAIR, **change})


def test_a_primary_whose_fence_call_goes_unanswered_unlinks_its_portals_until_the_controller_answers(
    tmp_path: Path,
) -> None:
    agent = replicated_agent(tmp_path, Kernel())
    vol = create(agent)
    agent.set_replica_role(vol, "primary", 1)
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    calls = [spool / f"fence-peer.nv-{vol}.{pid}.req" for pid in (4242, 4343)]
    calls[0].write_text("")
    assert agent.self_fence.run_once() == []  # a fresh call: the controller answers within a second
    old = time.time() - 6
    os.utime(calls[0], (old, old))
    assert agent.self_fence.run_once() == [vol] and agent.self_fence.run_once() == []  # once
    assert linked(agent, vol) == [] and namespace(agent, vol)["enable"] == "1"  # the namespace stays
    assert agent.answer_fence(vol, 4242, True)  # the controller: go on as the one writer
    assert sorted(linked(agent, vol)) == ["1", "2"]
    calls[1].write_text("")
    os.utime(calls[1], (old, old))
    assert agent.self_fence.run_once() == [vol]
    assert agent.answer_fence(vol, 4343, False) and linked(agent, vol) == []  # refused: stays unlinked


def test_a_replicas_health_says_what_its_role_means(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    assert agent.volume_health(vol) == []  # a secondary: its namespace disabled by design
    agent.set_replica_role(vol, "primary", 1)
    assert agent.volume_health(vol) == []  # both in sync
    assert kernel.minor is not None
    kernel.minor.update(cs="WFConnection", pds="DUnknown")
    assert [(s, r) for s, r, _ in agent.volume_health(vol)] == [("degraded", "ReplicaNotInSync")]
    assert "1 of 2 replicas in sync" in agent.volume_health(vol)[0][2]
    agent.set_replica_role(vol, "fenced", 2)
    assert agent.volume_health(vol) == []  # fenced: unlinked and disabled by design


def test_a_replica_is_copied_only_while_it_holds_every_acknowledged_write(
    tmp_path: Path,
) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    params = VolumeParameters.parse({})
    with pytest.raises(FailedPrecondition, match="Secondary/Inconsistent"):
        agent.create_snapshot("snap-r", vol)  # a new pair's replica before its first sync
    with pytest.raises(FailedPrecondition, match=r"copied \(snapshot or clone\) while its replica"):
        agent.create_volume("clone-r", 64 * MiB, params, {}, source_volume=vol)
    assert not agent.state.current.snapshots and [v.record.name for v in agent.list_volumes()] == ["pvc-r"]
    assert kernel.minor is not None
    kernel.minor.update(ds="UpToDate", cs="Connected")  # a Secondary in step with its primary: protocol C
    snap = agent.create_snapshot("snap-r", vol)
    whole = 64 * MiB + metadata_bytes(64 * MiB)  # DRBD's device reaches into the room kept for its metadata
    assert agent.store.snapshot_path(snap.uuid).stat().st_size == whole
    clone = agent.create_volume("clone-r", 64 * MiB, params, {}, source_volume=vol).record
    assert agent.store.volume_path(clone.uuid).stat().st_size == whole and not clone.replica
    kernel.minor.update(cs="WFConnection")  # cut off: the primary may go on without it
    with pytest.raises(FailedPrecondition, match=r"Secondary/UpToDate \(WFConnection\)"):
        agent.create_snapshot("snap-late", vol)
    agent.set_replica_role(vol, "primary", 1)  # a primary alone holds every write it acknowledged
    assert agent.create_snapshot("snap-late", vol).status == "ready"


def test_a_split_brain_loser_connects_again_discarding_its_changes_only_when_told(tmp_path: Path) -> None:
    kernel = Kernel()
    agent = replicated_agent(tmp_path, kernel)
    vol = create(agent)
    assert kernel.minor is not None
    agent.set_replica_role(vol, "primary", 1)
    with pytest.raises(FailedPrecondition, match="through fenced or handover"):
        agent.set_replica_role(vol, "discard", 2)  # a Primary is fenced first (its ports away, then demoted)
    agent.set_replica_role(vol, "fenced", 2)
    kernel.minor.update(cs="StandAlone")  # DRBD found both sides changed and refused to connect
    before = len(kernel.calls)
    view = agent.set_replica_role(vol, "discard", 3)
    assert kernel.words()[before:] == ["connect"], kernel.words()[before:]
    assert kernel.calls[-1][-4:-1] == ["--", "--discard-my-data", "connect"]
    assert (view.record.replica["role"], view.record.replica["epoch"]) == ("secondary", "3")
    assert sorted(linked(agent, vol)) == ["1", "2"] and namespace(agent, vol)["enable"] == "0"
    before = len(kernel.calls)
    agent.set_replica_role(vol, "discard", 3)  # repeated while it connects: DRBD is left as it is
    assert "--discard-my-data" not in [w for c in kernel.calls[before:] for w in c]
