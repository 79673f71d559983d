"""The host helper DRBD's kernel runs for ``fence-peer`` (``agent/fence_spool.py``), run by the real ``/bin/sh``:
it waits, I/O frozen, until the agent's spool answers, and exits with the code the agent decided; calls that are
not the driver's are answered at once. An agent that restarts answers what its predecessor left."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from nvmeof_csi.agent.api import AgentServicer
from nvmeof_csi.agent.drbd import DrbdResources
from nvmeof_csi.agent.fence_spool import PEER_FENCED, STAY_FROZEN, FenceRequest, FenceSpool, helper_script
from nvmeof_csi.agent.replica_devices import LoopLinks
from nvmeof_csi.agent.replicas import Replication
from nvmeof_csi.agent.state_model import VolumeRecord
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.host.executor import SubprocessExecutor
from tests.support.agents import make_agent

RES = "nv-0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01"


def helper(tmp_path: Path) -> tuple[Path, Path]:
    spool = tmp_path / "spool"
    spool.mkdir()
    script = tmp_path / "drbd-helper"
    script.write_text(helper_script(str(spool)))
    script.chmod(0o755)
    return script, spool


def wait_for_request(spool: FenceSpool, seconds: float = 10) -> list[FenceRequest]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = spool.pending()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("the helper wrote no request")


def test_the_helper_waits_for_the_agents_answer_and_exits_with_it(tmp_path: Path) -> None:
    script, folder = helper(tmp_path)
    asked: list[str] = []
    answers: list[int | None] = [None, PEER_FENCED]  # the controller unreachable once, then it answers

    def decide(request: FenceRequest) -> int | None:
        asked.append(request.resource)
        return answers.pop(0)

    spool = FenceSpool(folder, decide)
    call = subprocess.Popen([str(script), "fence-peer", RES])
    (request,) = wait_for_request(spool)
    assert (request.command, request.resource, request.pid) == ("fence-peer", RES, call.pid)
    assert spool.answer_pending() == 0  # no answer yet: the helper keeps waiting (I/O frozen)
    time.sleep(1.5)
    assert call.poll() is None
    assert spool.answer_pending() == 1
    assert call.wait(timeout=10) == PEER_FENCED and asked == [RES, RES]
    assert list(folder.iterdir()) == []  # the helper cleans up after itself


def test_a_refused_replica_is_left_frozen_and_a_restarted_agent_answers_what_was_left(tmp_path: Path) -> None:
    script, folder = helper(tmp_path)
    call = subprocess.Popen([str(script), "fence-peer", RES])
    wait_for_request(FenceSpool(folder, lambda r: None))  # the first agent dies without answering
    assert FenceSpool(folder, lambda r: STAY_FROZEN).answer_pending() == 1  # its successor
    assert call.wait(timeout=10) == STAY_FROZEN  # outside 3-7: DRBD keeps the resource's I/O frozen


def test_calls_that_are_not_the_drivers_are_answered_at_once(tmp_path: Path) -> None:
    script, folder = helper(tmp_path)
    for argv in (["fence-peer", "r0"], ["after-resync-target", "minor-3"], ["fence-peer", "nv-x; rm -rf /"]):
        assert subprocess.run([str(script), *argv], timeout=10, check=False).returncode == 0
    assert list(folder.iterdir()) == []


def test_a_file_the_helper_did_not_write_is_removed_unanswered(tmp_path: Path) -> None:
    _, folder = helper(tmp_path)
    (folder / "fence-peer.nv-0b6d5bd6-4c1e-4f55-9d7a-3E0F6F1A7C01.1.req").write_text("x")  # not canonical
    (folder / "other.req").write_text("x")
    decided: list[FenceRequest] = []

    def decide(request: FenceRequest) -> int:
        decided.append(request)
        return PEER_FENCED

    assert FenceSpool(folder, decide).answer_pending() == 0
    assert decided == [] and list(folder.iterdir()) == []


def test_the_helper_is_only_written_for_a_plain_absolute_spool_folder() -> None:
    for bad in ("spool", "/var/lib/../etc", "/var/lib/x'; reboot; '"):
        with pytest.raises(ValueError, match="spool folder"):
            helper_script(bad)


def test_the_agent_api_lists_a_waiting_call_with_the_askers_term_and_carries_the_controllers_answer(
    tmp_path: Path,
) -> None:
    """ListFenceRequests names the volume, the helper's process and the asker's replica role and epoch (the
    arbiter's term); AnswerFenceRequest ends that one call: the helper exits 4 ("peer fenced"), or 1 when refused;
    a second answer to the same call finds nothing waiting."""
    script, folder = helper(tmp_path)
    vol = RES.removeprefix("nv-")
    base = make_agent(tmp_path / "agent")
    never = SubprocessExecutor()  # no DRBD or loop command runs here
    replication = Replication(DrbdResources(never, tmp_path / "drbd"), LoopLinks(never, tmp_path / "links"),
                              "storage-1", str(script), FenceSpool(folder, lambda request: None))  # fmt: skip
    agent = TargetAgent(base.name, base.nvmet, base.store, base.state, base.portals, replication=replication)
    agent.state.put_volume(VolumeRecord(vol, "r", 1 << 20, replica={"role": "primary", "epoch": "7"}))
    api = AgentServicer(agent, [])
    for decision, code in ((True, PEER_FENCED), (False, STAY_FROZEN)):
        call = subprocess.Popen([str(script), "fence-peer", RES])
        wait_for_request(FenceSpool(folder, lambda request: None))
        listed = api.ListFenceRequests(pb.ListFenceRequestsRequest(), None).requests  # type: ignore[arg-type]
        assert [(r.volume_uuid, r.pid, r.role, r.epoch) for r in listed] == [(vol, call.pid, "primary", 7)]
        request = pb.AnswerFenceRequestRequest(volume_uuid=vol, pid=call.pid, peer_fenced=decision)
        assert api.AnswerFenceRequest(request, None).answered  # type: ignore[arg-type]
        assert call.wait(timeout=10) == code
        assert not api.AnswerFenceRequest(request, None).answered  # type: ignore[arg-type]
