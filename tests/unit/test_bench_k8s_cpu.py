"""Where the CPU went in the Kubernetes benchmark: the program each node VM runs reads /proc as it is (run here on
this host), and the shares come out of two readings."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench.k8s_cpu import GUEST, PARTS, spent


def test_the_guest_program_counts_processes_by_part_and_never_itself() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass", "csi-provisioner"])  # looks like one
    try:
        time.sleep(0.5)
        out = json.loads(subprocess.run([sys.executable, "-c", GUEST, json.dumps(PARTS)], check=True,
                                        capture_output=True, text=True).stdout)  # fmt: skip
    finally:
        busy.kill()
    assert out["parts"].get("external-provisioner", 0) > 0.1  # the spinning stand-in
    assert "our controller" not in out["parts"]  # the program's own argv holds "--mode=controller"
    assert out["cpus"] >= 1 and out["busy"] > 0 and out["idle"] >= 0


def test_shares_are_of_one_cpu_over_the_wall_time_and_the_vm_busy_share_of_all_its_cpus() -> None:
    before = {"nodes": {"s1": {"parts": {"our agent": 10.0}, "busy": 100.0, "idle": 100.0, "cpus": 2}},
              "host": {"kube-apiserver": 5.0}}  # fmt: skip
    after = {"nodes": {"s1": {"parts": {"our agent": 25.0, "kubelet": 2.0}, "busy": 118.0, "idle": 102.0, "cpus": 2}},
             "host": {"kube-apiserver": 8.0, "etcd": 1.0}}  # fmt: skip
    before["machine"], after["machine"] = {"busy": 50.0, "idle": 50.0}, {"busy": 68.0, "idle": 52.0}
    got = spent(before, after, 10.0)
    assert got["host_busy_share"] == 0.9  # the host that emulates the VMs
    assert got["nodes"]["s1"]["parts"] == {"our agent": 1.5, "kubelet": 0.2}
    assert list(got["nodes"]["s1"]["parts"]) == ["our agent", "kubelet"]  # largest first
    assert got["nodes"]["s1"]["vm_busy_share"] == 0.9
    assert got["control_plane"] == {"kube-apiserver": 0.3, "etcd": 0.1}


def test_the_report_line_names_the_busiest_parts_and_how_busy_each_vm_was() -> None:
    from bench.scale_notes import cpu_line

    before = {"nodes": {"s1": {"parts": {}, "busy": 0.0, "idle": 0.0, "cpus": 2}}, "host": {"etcd": 0.0}}
    after = {"nodes": {"s1": {"parts": {"our agent": 9.0, "our controller": 6.0}, "busy": 19.0, "idle": 1.0,
                              "cpus": 2}}, "host": {"etcd": 2.0}}  # fmt: skip
    line = cpu_line(spent(before, after, 10.0))
    assert (
        line
        == "s1 (2 vCPUs, 95 % busy): our agent 0.9, our controller 0.6; control plane on the host: etcd 0.2 (CPUs busy)"
    )


def test_a_dump_counts_each_thread_by_its_innermost_frames_and_a_pools_threads_under_one_name() -> None:
    from bench.k8s_dumps import where

    dump = """Process 41: /opt/nvmeof-csi/bin/python /opt/nvmeof-csi/bin/nvmeof-csi serve --mode=controller
Python v3.11.2 (/usr/bin/python3.11)

Thread 0x7F01 (idle): "MainThread"
    select (selectors.py:468)
    run_forever (asyncio/base_events.py:607)
Thread 0x7F02 (idle): "asyncio_0"
    _blocking_unary_unary (/opt/nvmeof-csi/lib/python3.11/site-packages/grpc/_channel.py:1162)
    call (/opt/nvmeof-csi/lib/python3.11/site-packages/nvmeof_csi/agentclient/client.py:88)
    create (/opt/nvmeof-csi/lib/python3.11/site-packages/nvmeof_csi/service/provisioning.py:120)
Thread 0x7F03 (idle): "asyncio_1"
    _blocking_unary_unary (/opt/nvmeof-csi/lib/python3.11/site-packages/grpc/_channel.py:1162)
    call (/opt/nvmeof-csi/lib/python3.11/site-packages/nvmeof_csi/agentclient/client.py:88)
"""
    assert where(dump) == {
        "asyncio_N | call (nvmeof_csi/agentclient/client.py) | _blocking_unary_unary (grpc/_channel.py)": 2,
        "MainThread | - | select (selectors.py)": 1,
    }
    assert where("") == {}
