"""QoS and fabric knobs on the real kernel, through CSI against the driver in the lab VM: the queue-depth
parameters are the controllers' queue count and SQ size in sysfs, ``tos`` is on every NVMe/TCP socket of the
initiator (socket diagnostics), and a pod's IOPS limit is its cgroup's io.max line for the head disk, which
fio running in that pod cannot exceed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import pytest

from lab import Fabric
from lab.fabric import wait_until
from lab.pods import in_pod, make_pod, remove_pod
from lab.stack import QOS_PERIOD, GuestDriver

pytestmark = pytest.mark.lab
MiB = 1 << 20
POD = "0c9d7e6f-5a4b-4c3d-8e2f-1a0b9c8d7e6f"
Reporter = Callable[[str, str], None]


def sysfs(stack: GuestDriver, ctrl: str, attr: str) -> str:
    return stack.vm.check(["cat", f"/sys/class/nvme/{ctrl}/{attr}"], timeout=30).strip()


def socket_tos(stack: GuestDriver, side: str, port: int) -> list[str]:
    """The ToS of every established TCP socket whose ``side`` (``dport``: the initiator's queues, connected *to*
    the target port; ``sport``: the target's, nvmet-tcp's kernel sockets accepted *on* it) is ``port``."""
    out = stack.vm.check(["ss", "-tnH", "--tos", "state", "established", side, f"= :{port}"], timeout=30)
    return re.findall(r"tos:(0x[0-9a-f]+)", out)


def test_queue_depth_and_traffic_class_reach_the_kernel(stack: GuestDriver, report: Reporter) -> None:
    fabric = Fabric(stack.vm)
    steps = stack.csi(
        {
            "op": "up",
            "name": "qd",
            "size": 64 * MiB,
            "mode": "block",
            "params": {"nrIoQueues": "1", "queueSize": "32", "tos": "184"},
        },
        {"op": "up", "name": "plain", "size": 64 * MiB, "mode": "block"},
    )
    try:
        tuned, plain = steps[0]["nqn"], steps[1]["nqn"]
        paths, plain_paths = fabric.wait_paths(tuned, live=2), fabric.wait_paths(plain, live=2)
        seen = {
            p.controller: (sysfs(stack, p.controller, "queue_count"), sysfs(stack, p.controller, "sqsize"))
            for p in paths
        }
        default = {
            p.controller: (sysfs(stack, p.controller, "queue_count"), sysfs(stack, p.controller, "sqsize"))
            for p in plain_paths
        }
        report("queue depth", f"nrIoQueues=1 queueSize=32 -> (queue_count, sqsize) {seen}; defaults {default}")
        # queue_count counts the admin queue too; sqsize is 0's based
        assert set(seen.values()) == {("2", "31")}, seen
        assert all(v != ("2", "31") for v in default.values()), "the defaults already look like the knobs"
        tos = {port: socket_tos(stack, "dport", port) for port in (4420, 4421)}
        # the target side: nvmet-tcp gives each accepted socket the ToS the host's SYN carried (its rcv_tos), so the
        # replies of the marked volume's queues are marked too; the agent sets nothing for it
        target = {port: socket_tos(stack, "sport", port) for port in (4420, 4421)}
        report("traffic class", f"tos=184 -> initiator sockets per portal {tos}; target sockets {target}")
        # one socket per queue (admin + 1 I/O) per controller and portal, every one of them marked; the plain volume's
        # sockets (default tos) are there too, so exactly 2 of each portal's sockets carry 0xb8, on either side
        assert all(found.count("0xb8") == 2 for found in tos.values()), tos
        assert all(found.count("0xb8") == 2 for found in target.values()), target
    finally:
        stack.csi({"op": "down", "name": "qd"}, {"op": "down", "name": "plain"})


def fio_in_pod(stack: GuestDriver, pod: str, device: str, rw: str, seconds: int) -> dict[str, float]:
    out = stack.vm.check(
        in_pod(
            pod,
            [
                "fio",
                "--name=qos",
                f"--filename={device}",
                f"--rw={rw}",
                "--bs=4k",
                "--direct=1",
                "--ioengine=psync",
                "--time_based",
                f"--runtime={seconds}",
                "--size=48M",
                "--output-format=json",
            ],
        ),
        timeout=seconds + 300,
    )
    job = json.loads(out[out.index("{") :])["jobs"][0]
    return {"read": job["read"]["iops"], "write": job["write"]["iops"], "errors": job["error"]}


def test_a_pods_iops_limit_is_its_io_max_line_and_fio_in_the_pod_meets_it(stack: GuestDriver, report: Reporter) -> None:
    vm = stack.vm
    pod = make_pod(vm, POD, qos="besteffort", driver="cgroupfs")
    try:
        raw = stack.csi(
            {
                "op": "up",
                "name": "lim",
                "size": 64 * MiB,
                "mode": "block",
                "params": {"readIops": "120", "writeIops": "80"},
                "pod": POD,
            }
        )[0]
        device = raw["target"]
        head = Fabric(vm).head_device(raw["nqn"])
        assert head is not None
        number = vm.check(["cat", f"/sys/block/{head.rsplit('/', 1)[1]}/dev"], timeout=30).strip()
        lines = vm.read(f"{pod}/io.max").splitlines()
        report("io.max", f"{lines}")
        assert lines == [f"{number} rbps=max wbps=max riops=120 wiops=80"], (lines, number)
        reads = fio_in_pod(stack, pod, device, "randread", 12)
        writes = fio_in_pod(stack, pod, device, "randwrite", 12)
        report(
            "limited pod",
            f"randread {reads['read']:.1f} IOPS (limit 120), randwrite {writes['write']:.1f} IOPS (limit 80)",
        )
        assert reads["errors"] == 0 and writes["errors"] == 0
        assert abs(reads["read"] - 120) <= 6 and abs(writes["write"] - 80) <= 4, (reads, writes)

        # a live change (VolumeAttributesClass -> ControllerModifyVolume): no remount, the pod keeps its device
        stack.one("modify", "lim", params={"readIops": "60", "csi.storage.k8s.io/pvc/name": "lim"})
        replied = time.monotonic()
        assert wait_until(lambda: "riops=60" in vm.read(f"{pod}/io.max"), 10, interval=0.1), vm.read(f"{pod}/io.max")
        took = time.monotonic() - replied
        slower = fio_in_pod(stack, pod, device, "randread", 10)
        report(
            "live change",
            f"readIops 120 -> 60 in force {took:.2f}s after ControllerModifyVolume replied "
            f"(reconcile period 1 s); randread now {slower['read']:.1f} IOPS",
        )
        assert took <= QOS_PERIOD + 2.0, took
        assert slower["errors"] == 0 and abs(slower["read"] - 60) <= 3, slower
        assert vm.read(f"{pod}/io.max").split() == [number, "rbps=max", "wbps=max", "riops=60", "wiops=80"]
        stack.csi({"op": "unpublish", "name": "lim"})
        assert vm.read(f"{pod}/io.max").strip() == "", "unpublish left the pod's io.max line"
    finally:
        stack.csi({"op": "down", "name": "lim"})
        remove_pod(vm, pod)
