"""The target agent on real configfs in the lab: reachable only by allowed hosts, restart-safe,
reboot-restoring, crash-consistent under SIGKILL, race-free, and ANA flips seen by a connected host."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import pytest

from lab import Fabric, LabVM
from lab.build import REPO
from lab.fabric import wait_until
from lab.target import GuestTargetAgent
from tests.lab_agent.conftest import P1, P2
from tests.lab_agent.test_readonly_lab import READER, write_refused

pytestmark = pytest.mark.lab
MiB = 1 << 20
STRANGER = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
Reporter = Callable[[str, str], None]


def test_volume_is_reachable_by_the_allowed_host_only(lab_vm: LabVM, fabric: Fabric, agent: GuestTargetAgent) -> None:
    vol = agent.ops("create", "pvc-a", str(64 * MiB), lab_vm.hostnqn)
    nqn = vol["nqn"]
    assert lab_vm.read(f"/sys/kernel/config/nvmet/subsystems/{nqn}/attr_allow_any_host").strip() == "0"
    refused = lab_vm.run(
        ["nvme", "connect", "-t", "tcp", "-a", P1.traddr, "-s", str(P1.trsvcid), "-n", nqn, f"--hostnqn={STRANGER}"],
        timeout=60,
    )
    assert refused.rc != 0 and fabric.head_device(nqn) is None
    fabric.connect(P1, nqn)
    head = fabric.wait_head(nqn).removeprefix("/dev/")
    assert lab_vm.read(f"/sys/block/{head}/uuid").strip() == vol["uuid"]
    assert int(lab_vm.read(f"/sys/block/{head}/size")) * 512 == 64 * MiB
    agent.ops("resize", vol["uuid"], str(96 * MiB))  # file grows, the namespace is revalidated
    assert wait_until(lambda: int(lab_vm.read(f"/sys/block/{head}/size")) * 512 == 96 * MiB, 30)


def test_restart_changes_nothing_and_a_power_cut_after_acknowledged_calls_loses_none_of_them(
    lab_vm: LabVM, fabric: Fabric, agent: GuestTargetAgent, report: Reporter
) -> None:
    """A graceful restart changes nothing (the host never notices). Then the plug is pulled right after the last
    acknowledged call: the agent leaves two steps unflushed (agent/state.py: removing a deleting record, renaming
    a new volume ready; ext4 commits every 5 s, so the rename is most likely lost), and the boot must bring back
    every acknowledged volume ready and exported as before (ANA state, read-only subsystem with its loop and dm
    map, the data flushed to it), the last one too, and no deleted one. One boot proves both."""
    vols = [agent.ops("create", f"pvc-{i}", str(32 * MiB), lab_vm.hostnqn) for i in range(2)]
    agent.ops("allow", vols[1]["uuid"], READER, "ro")  # its read-only subsystem: loop + dm map, made again at boot
    agent.ctl("ana", "set", "b", "non-optimized")
    fabric.connect(P1, vols[0]["nqn"])
    head = fabric.wait_head(vols[0]["nqn"])
    lab_vm.check(["dd", "if=/dev/urandom", "of=/scratch/pattern", "bs=1M", "count=4", "conv=fsync"])
    lab_vm.check(["dd", "if=/scratch/pattern", f"of={head}", "bs=1M", "oflag=direct", "conv=fsync"])  # a flush
    before = agent.ops("dump")
    assert len(before["subsystems"]) == 3 and before["ports"]["2"]["ana"] == "non-optimized"
    controller = fabric.paths(vols[0]["nqn"])[0].controller
    agent.stop("TERM")
    report("agent start", f"{agent.start():.1f}s")
    assert agent.ops("dump") == before
    assert fabric.paths(vols[0]["nqn"])[0].controller == controller  # the host never noticed
    fabric.disconnect_all()
    gone = agent.ops("create", "pvc-cut-gone", str(32 * MiB))
    lab_vm.check(["sync"])
    agent.ops("delete", gone["uuid"])
    late = agent.ops("create", "pvc-cut-late", str(32 * MiB))  # the last call (no host grant after it): the plug
    report("power cut: boot-to-ready after pulling the plug", f"{lab_vm.reboot(hard=True):.1f}s")
    Fabric(lab_vm).load(rdma=True)
    assert lab_vm.listdir("/sys/kernel/config/nvmet/subsystems") == []
    report("agent start after the power cut (converge)", f"{agent.start():.1f}s")
    replayed = f"finished creating volume {late['uuid']}" in agent.log_tail()
    report("power cut: the last create's ready rename was lost and finished by the agent's start", str(replayed))
    listed = {v["name"]: v for v in agent.ops("list")}
    assert set(listed) == {"pvc-0", "pvc-1", "pvc-cut-late"}
    assert listed["pvc-cut-late"]["uuid"] == late["uuid"] and all(v["status"] == "ready" for v in listed.values())
    after = agent.ops("dump")
    assert sorted(after["subsystems"]) == sorted([*before["subsystems"], late["nqn"]])
    assert {k: v for k, v in after["subsystems"].items() if k != late["nqn"]} == before["subsystems"]
    assert after["ports"]["2"]["ana"] == "non-optimized"
    assert agent.ops("create", "pvc-cut-late", str(32 * MiB), lab_vm.hostnqn)["uuid"] == late["uuid"]  # a retry
    fabric.connect(P1, late["nqn"])
    assert lab_vm.read(f"/sys/block/{fabric.wait_head(late['nqn']).removeprefix('/dev/')}/uuid").strip() == late["uuid"]
    fabric.connect(P1, vols[0]["nqn"])
    head = fabric.wait_head(vols[0]["nqn"])
    lab_vm.check(["cmp", "-n", str(4 * MiB), "/scratch/pattern", head])
    assert write_refused(lab_vm, fabric, vols[1]["nqn"] + ":ro")  # still refused after the power cut


def test_fifty_concurrent_creates_over_ten_names(lab_vm: LabVM, agent: GuestTargetAgent) -> None:
    result = agent.ops("concurrent", "50", "10", str(MiB))
    assert result == {"calls": 50, "distinct_uuids": 10, "volumes": 10}
    assert len(lab_vm.listdir("/sys/kernel/config/nvmet/subsystems")) == 10


def test_nvmeofctl_ana_set_is_seen_by_the_connected_host(
    lab_vm: LabVM, fabric: Fabric, agent: GuestTargetAgent
) -> None:
    vol = agent.ops("create", "pvc-ana", str(32 * MiB), lab_vm.hostnqn)
    for portal in (P1, P2):
        fabric.connect(portal, vol["nqn"])
    fabric.wait_paths(vol["nqn"], live=2)
    rows = agent.ctl("ana", "set", "a", "inaccessible")
    assert {r["group"]: r["ana_state"] for r in rows} == {"a": "inaccessible", "b": "optimized"}

    def seen() -> dict[str, str]:
        return {p.address.split(",")[0]: p.ana_state for p in fabric.paths(vol["nqn"])}

    assert wait_until(lambda: seen().get("traddr=127.0.0.1") == "inaccessible", 20), seen()
    assert seen()["traddr=127.0.0.2"] == "optimized"


def test_sigkill_crash_loop_on_real_configfs(lab_vm: LabVM, fabric: Fabric, report: Reporter) -> None:
    lab_vm.run(["rm", "-rf", "/scratch/crash"], 60)
    start = time.monotonic()
    out = lab_vm.check(
        [
            lab_vm.python,
            "-m",
            "tests.support.crashloop",
            "/scratch/crash",
            "--ops",
            "60",  # and more until 5 kills (one every 2-8 s): each life does work, some kills hit a start-up
            "--min-kills",
            "5",
            "--configfs",
            "/sys/kernel/config/nvmet",
            "--kill-every",
            "2",
            "8",
        ],
        timeout=900,
        cwd=str(REPO),
    )
    result = json.loads(out.strip().splitlines()[-1])
    report(
        "crash loop",
        f"{result['ops']} ops, {result['kills']} SIGKILLs ({result['kills_while_starting']} while starting), {result['interrupted_rpcs']} interrupted "
        f"RPCs, {len(result['state_names'])} volumes left, {time.monotonic() - start:.0f}s",
    )
    assert result["kills"] >= 5 and result["state_names"] == result["expected_names"], result
    assert result["subsystems_match"] and result["files_match"] and result["links_match"], result
    assert not result["restart_changed_configfs"] and result["corrupt"] == [], result
    lab_vm.run(["rm", "-rf", "/scratch/crash"], 60)


def test_an_agent_with_a_cntlid_window_gives_every_controller_an_id_inside_it(
    lab_vm: LabVM, fabric: Fabric, report: Reporter
) -> None:
    """Two agents that expose one subsystem (a replicated volume) must give disjoint controller IDs: a host refuses
    a second controller whose cntlid it already holds. On real configfs, an agent started with
    ``--cntlid-window`` writes it, and the host's controllers over both portals carry IDs inside it (before, the
    kernel's default gave 1 and 2, on every agent alike)."""
    windowed = GuestTargetAgent(lab_vm, [P1, P2], groups=["a", "b"], extra_args=["--cntlid-window", "1000-1999"])
    windowed.wipe()
    windowed.start()
    try:
        nqn = windowed.ops("create", "pvc-window", str(32 * MiB), lab_vm.hostnqn)["nqn"]
        sub = f"/sys/kernel/config/nvmet/subsystems/{nqn}"
        assert (lab_vm.read(f"{sub}/attr_cntlid_min").strip(), lab_vm.read(f"{sub}/attr_cntlid_max").strip()) == (
            "1000",
            "1999",
        )
        fabric.connect(P1, nqn)
        fabric.connect(P2, nqn)
        fabric.wait_head(nqn)
        found = fabric._subsystem_dir(nqn)
        assert found is not None
        ids = sorted(
            int(lab_vm.read(f"/sys/class/nvme/{c}/cntlid"))
            for c in lab_vm.listdir(found)
            if re.fullmatch(r"nvme\d+", c)
        )
        report("cntlid window 1000-1999: the host's controllers", str(ids))
        assert len(ids) == 2 and all(1000 <= i <= 1999 for i in ids), ids
    finally:
        windowed.stop()
        fabric.clear()
        windowed.wipe()
