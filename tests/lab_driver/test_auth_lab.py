"""DH-HMAC-CHAP on the real kernel (the 6.12 lab kernel: nvmet and the host built with in-band
authentication), end to end through CSI: a StorageClass with ``auth: dhchap-bidirectional`` and no secret at
all; the agent issues the host random keys at ControllerPublishVolume, the node fetches its own at
NodeStageVolume, and the kernel is the judge. nvme-cli in the guest plays the intruder, with the node's own host
NQN and with another host's NQN and the node's keys (a second host NQN in the one VM stands for a second node)."""

from __future__ import annotations

import pytest

from lab import Fabric, LabVM
from lab.fabric import wait_until
from lab.stack import DRIVER_LOG, GuestDriver
from lab.target import LOG as AGENT_LOG
from lab.target import STATE_DIR, TWO_PORTALS

pytestmark = pytest.mark.lab
MiB = 1 << 20
NEIGHBOUR_ID = "0d0d0d0d-1111-2222-3333-444444444444"
NEIGHBOUR = f"nqn.2014-08.org.nvmexpress:uuid:{NEIGHBOUR_ID}"
CONFIGFS = "/sys/kernel/config/nvmet"
P1 = TWO_PORTALS[0]


def cat(vm: LabVM, path: str) -> str:
    return vm.check(["cat", path], timeout=10).strip()


def raw_connect(vm: LabVM, nqn: str, *keys: str) -> int:
    """``nvme connect`` (as the node's host, its /etc/nvme identity, unless ``keys`` name another) with the given
    key options; the exit code. A controller it made is removed again."""
    res = vm.run(["nvme", "connect", "-t", "tcp", "-a", P1.traddr, "-s", str(P1.trsvcid), "-n", nqn, *keys], 60)
    if res.rc == 0:
        vm.run(["nvme", "disconnect", "-n", nqn], 60)
    return res.rc


def test_dhchap_bidirectional_through_csi(stack: GuestDriver, kernel_release: str) -> None:
    vm = stack.vm
    assert kernel_release.startswith("6.12"), kernel_release
    params = {"auth": "dhchap-bidirectional"}
    step = stack.csi({"op": "create", "name": "au", "size": 64 * MiB, "mode": "mount", "fs": "ext4", "params": params})[
        0
    ]
    nqn = step["nqn"]
    try:
        stack.one("attach", "au")  # no secret anywhere: the agent issues this host's keys
        host_nqn = cat(vm, "/etc/nvme/hostnqn")
        host_dir = f"{CONFIGFS}/hosts/{host_nqn}"
        key, ctrl_key = cat(vm, f"{host_dir}/dhchap_key"), cat(vm, f"{host_dir}/dhchap_ctrl_key")
        assert key.startswith("DHHC-1:00:") and ctrl_key.startswith("DHHC-1:00:") and key != ctrl_key
        assert cat(vm, f"{host_dir}/dhchap_dhgroup") == "ffdhe2048"
        modes = vm.check(["find", f"{STATE_DIR}/volumes", "-name", "*.json", "-printf", "%m\\n"], timeout=10).split()
        assert modes and set(modes) == {"600"}, modes  # the records hold DH-HMAC-CHAP keys
        steps = stack.csi(
            {"op": "stage", "name": "au"},  # the node fetches the keys the agent issued to it
            {"op": "publish", "name": "au"},
            {"op": "probe-target", "name": "au", "mib": 4},
        )
        Fabric(vm).wait_paths(nqn, live=2)
        ctrls = [c for c in vm.listdir("/sys/class/nvme") if cat(vm, f"/sys/class/nvme/{c}/subsysnqn") == nqn]
        assert len(ctrls) == 2
        for ctrl in ctrls:  # the host's controllers hold the very keys the agent gave the target
            assert cat(vm, f"/sys/class/nvme/{ctrl}/dhchap_secret") == key
            assert cat(vm, f"/sys/class/nvme/{ctrl}/dhchap_ctrl_secret") == ctrl_key
        for ctrl, attr in ((c, a) for c in ctrls for a in ("dhchap_secret", "dhchap_ctrl_secret")):
            path = f"/sys/class/nvme/{ctrl}/{attr}"  # the kernel makes it 0644: every pod could read the key
            assert vm.check(["stat", "-c", "%a", path], timeout=10).strip() == "600", path
            nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", path]
            assert vm.run(nobody, 10).rc != 0, f"{path} is readable by a user other than root"
        assert "authenticated" in vm.check(["dmesg"], timeout=10)

        # a roll: the agent issues the host a new key; the node's next pass (--qos-period) writes it to its live
        # controllers, which re-authenticate in place (the same controllers, no reconnect), I/O goes on, and a
        # reconnect then authenticates with the new key
        stack.agent.ctl("hosts", "rotate-key", host_nqn)
        new_key = cat(vm, f"{host_dir}/dhchap_key")
        assert new_key != key and cat(vm, f"{host_dir}/dhchap_ctrl_key") == ctrl_key

        def rolled() -> bool:
            return all(cat(vm, f"/sys/class/nvme/{c}/dhchap_secret") == new_key for c in ctrls)

        assert wait_until(rolled, 60), "the node did not roll its controllers to the new key"
        paths = Fabric(vm).wait_paths(nqn, live=2)
        assert sorted(p.controller for p in paths) == sorted(ctrls), "a controller was made anew"
        target = steps[1]["target"]
        vm.check(["dd", "if=/dev/urandom", f"of={target}/after-roll", "bs=1M", "count=4", "conv=fsync"], timeout=60)
        vm.check(["nvme", "reset", f"/dev/{ctrls[0]}"], timeout=60)  # a reconnect: authenticated with the new key
        Fabric(vm).wait_paths(nqn, live=2)
        assert "authentication failed" not in vm.check(["dmesg"], timeout=10), "a re-authentication failed"
        old_key, key = key, new_key

        stack.csi({"op": "unpublish", "name": "au"}, {"op": "unstage", "name": "au"})
        assert Fabric(vm).paths(nqn) == []
        # an intruder with this node's host NQN: no key, a random key, the right key with a wrong controller key
        random_key = vm.check(["nvme", "gen-dhchap-key", "-n", host_nqn], timeout=30).strip()
        assert raw_connect(vm, nqn) != 0, "the target let a host in without a key"
        assert raw_connect(vm, nqn, f"--dhchap-secret={random_key}") != 0, "the target took a wrong key"
        assert raw_connect(vm, nqn, f"--dhchap-secret={old_key}") != 0, "the target took the rotated-out key"
        assert raw_connect(vm, nqn, f"--dhchap-secret={key}", f"--dhchap-ctrl-secret={random_key}") != 0, (
            "the host accepted a controller that could not prove the controller key"
        )
        assert raw_connect(vm, nqn, f"--dhchap-secret={key}", f"--dhchap-ctrl-secret={ctrl_key}") == 0

        # the volume moves to another node (one node at a time): that host gets keys of its own, and this node's
        # key material opens nothing of it
        stack.one("detach", "au")
        stack.one("attach", "au", node=NEIGHBOUR)
        neighbour_key = cat(vm, f"{CONFIGFS}/hosts/{NEIGHBOUR}/dhchap_key")
        assert neighbour_key not in (key, ctrl_key)
        as_neighbour = [f"--hostnqn={NEIGHBOUR}", f"--hostid={NEIGHBOUR_ID}"]
        assert raw_connect(vm, nqn, *as_neighbour, f"--dhchap-secret={key}") != 0, "one node's key opened another's"
        assert raw_connect(vm, nqn, *as_neighbour, f"--dhchap-secret={neighbour_key}") == 0  # the test is sound
        logs = vm.check(["cat", DRIVER_LOG, AGENT_LOG], timeout=30)
        for secret in (old_key, key, ctrl_key, neighbour_key):
            assert secret not in logs, "a secret reached a log"
    finally:
        vm.run(["nvme", "disconnect", "-n", nqn], 60)
        stack.csi({"op": "detach", "name": "au", "node": NEIGHBOUR}, {"op": "down", "name": "au"})
    assert not vm.exists(host_dir), "the host entry (with its keys) outlived the last grant"
