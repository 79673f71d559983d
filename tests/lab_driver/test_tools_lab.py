"""The operator's tools on the real fabric: ``nvmeofctl trace`` follows a published, limited volume from the
agent to the pod's mount; ``nvmeofctl doctor`` passes on the lab node, and fails with the fix when the node's
identity is shared with another node (multipath off: ``tests/lab/test_node_doctor.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from lab import Fabric
from lab.pods import make_pod, remove_pod
from lab.stack import NODE_STATE, GuestDriver
from lab.target import AGENT_SOCK, POOL_DIR

pytestmark = pytest.mark.lab
MiB = 1 << 20
POD = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
Reporter = Callable[[str, str], None]


def nvmeofctl(stack: GuestDriver, *args: str, rc: int = 0) -> str:
    res = stack.vm.run([stack.vm.python, "-m", "nvmeof_csi.cli.main", "--agent", f"unix://{AGENT_SOCK}", *args], 120)
    assert res.rc == rc, (args, res.rc, res.out[-3000:], res.err[-3000:])
    return res.out


def test_trace_follows_a_published_volume_from_agent_to_mount(stack: GuestDriver, report: Reporter) -> None:
    vm, fabric = stack.vm, Fabric(stack.vm)
    pod = make_pod(vm, POD)
    try:
        up = stack.csi(
            {
                "op": "up",
                "name": "tr",
                "size": 64 * MiB,
                "mode": "mount",
                "fs": "ext4",
                "params": {"readIops": "500"},
                "pod": POD,
            }
        )[0]
        fabric.wait_paths(up["nqn"], live=2)
        doc: dict[str, Any] = json.loads(
            nvmeofctl(stack, "-o", "json", "trace", up["volume_id"], "--node", "--state-dir", NODE_STATE)
        )[0]
        vol_uuid = up["volume_id"].rsplit(".", 1)[1]
        assert doc["agent"] == "agent"  # the target's name as nvmeofctl knows it (--agent: "agent")
        assert doc["nqn"] == up["nqn"] and doc["namespace_uuid"] == vol_uuid
        assert doc["backing_file"] == f"{POOL_DIR}/volumes/{vol_uuid}.img" and vm.exists(doc["backing_file"])
        assert sorted((p["trtype"], p["trsvcid"], p["ana_state"]) for p in doc["portals"]) == [
            ("rdma", 4420, "optimized"),
            ("rdma", 4421, "optimized"),
            ("tcp", 4420, "optimized"),
            ("tcp", 4421, "optimized"),
        ]  # the agent's every portal; the node connects to those of the volume's transport
        node = doc["node"]
        assert doc["allowed_hosts"] == [node["hostnqn"]]
        assert sorted(c["state"] for c in node["controllers"]) == ["live", "live"]
        assert node["device"]["path"] == fabric.head_device(up["nqn"])
        assert sorted(p["ana_state"] for p in node["device"]["paths"]) == ["optimized", "optimized"]
        staging = node["staging"]
        assert set(node["device"]["mounts"]) >= {staging["path"], up["target"]}, node["device"]["mounts"]
        assert staging["pods"] == {up["target"]: POD} and staging["limits"] == {"readIops": 500}
        assert staging["limits_in_force"] == [{"pod": POD, "enforced": True, "reason": ""}]
        screen = nvmeofctl(stack, "trace", up["volume_id"], "--node", "--state-dir", NODE_STATE)
        report("nvmeofctl trace --node", "\n" + screen)
        for needle in (up["nqn"], doc["backing_file"], "ANA optimized", f"for pod {POD}", "in force"):
            assert needle in screen, needle
    finally:
        stack.csi({"op": "down", "name": "tr"})
        remove_pod(vm, pod)


def checks(out: str) -> dict[str, str]:
    return {row["name"]: row["result"] for row in json.loads(out)}


def test_doctor_passes_on_this_node_and_fails_on_a_shared_identity(stack: GuestDriver, report: Reporter) -> None:
    """(Native multipath off is proven in the lab tier, where no target holds nvme_core: nvmet's passthru
    support depends on it, so it cannot be reloaded here with the agent running.)"""
    vm = stack.vm
    ready = checks(nvmeofctl(stack, "-o", "json", "doctor"))
    report("nvmeofctl doctor", str(ready))
    assert set(ready.values()) <= {"pass", "absent"} and ready["feature tcp"] == "pass", ready
    hostnqn = vm.read("/etc/nvme/hostnqn").strip()
    vm.write("/tmp/peers", f"nqn.2014-08.org.nvmexpress:uuid:00000000-1111-4222-8333-444444444444\n{hostnqn}\n")
    shared = checks(nvmeofctl(stack, "-o", "json", "doctor", "--peers", "/tmp/peers", rc=1))
    assert [k for k, v in shared.items() if v == "FAIL"] == ["identity unique"], shared
