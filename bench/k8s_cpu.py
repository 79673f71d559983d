"""Which process the CPU went to while the lab Kubernetes cluster worked (``bench/k8s_pvcs.py``): CPU seconds by
part of the system, read from ``/proc`` in every node VM (our controller, agent and node plugin, the sidecars,
kubelet and containerd) and on this host for the control plane's processes (``ControlPlane.procs``: API server,
etcd, scheduler, controller manager), with each VM's busy and idle CPU seconds and this host's. Two readings,
before and after some work, give each part's CPU over that time: the part that keeps a CPU busy, or a VM (or
under TCG the host that emulates them all) with no idle CPU left, is what sets the rate.

Contract: :func:`spent` is pure; :func:`reading` runs one small Python program in each VM (``GUEST``, with
``PARTS`` as its argument: it prints JSON) and reads ``/proc`` here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lab.kube.cluster import KubeCluster

#: (part, every word its command line holds), first match wins; anything else is not counted
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("our controller", ("nvmeof-csi", "--mode=controller")),
    ("our node plugin", ("nvmeof-csi", "--mode=node")),
    ("our agent", ("nvmeof-csi", " agent")),
    ("external-provisioner", ("csi-provisioner",)),
    ("other sidecars", ("csi-",)),
    ("snapshot controller", ("snapshot-controller",)),
    ("kubelet", ("kubelet",)),
    ("containerd", ("containerd",)),
)

#: runs in a node VM: {"parts": {part: cpu seconds}, "busy": s, "idle": s, "cpus": n}; PARTS is passed in argv
GUEST = r"""
import json, os, sys
parts, hz, out = json.loads(sys.argv[1]), os.sysconf("SC_CLK_TCK"), {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():  # its own command line holds every part's words
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    part = next((p for p, words in parts if all(w in cmd for w in words)), None)
    if part:
        out[part] = out.get(part, 0.0) + (int(stat[11]) + int(stat[12])) / hz
cpu = [int(v) / hz for v in open("/proc/stat").readline().split()[1:]]
print(json.dumps({"parts": out, "busy": sum(cpu) - cpu[3] - cpu[4], "idle": cpu[3] + cpu[4], "cpus": os.cpu_count()}))
"""


def _host_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reading(kube: KubeCluster) -> dict[str, Any]:
    """CPU seconds so far: ``{"nodes": {node: GUEST's answer}, "host": {process: seconds}}``."""
    nodes = {}
    for node in kube.nodes:
        vm = kube.vm(node)
        nodes[node] = json.loads(vm.check([vm.python, "-c", GUEST, json.dumps(PARTS)], timeout=120).strip())
    host = {name: _host_cpu_s(proc.pid) for name, proc in kube.cp.procs.items()}
    cpu = [int(v) / os.sysconf("SC_CLK_TCK") for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return {"nodes": nodes, "host": host, "machine": {"busy": sum(cpu) - cpu[3] - cpu[4], "idle": cpu[3] + cpu[4]}}


def spent(before: Mapping[str, Any], after: Mapping[str, Any], wall_s: float) -> dict[str, Any]:
    """Each part's CPU between two readings as a share of one CPU over ``wall_s`` (1.0: one CPU busy all the
    time), per node and for the host's control plane; and each VM's busy share of all its CPUs."""
    out: dict[str, Any] = {"nodes": {}, "control_plane": {}}
    for node, now in after["nodes"].items():
        was = before["nodes"].get(node, {"parts": {}, "busy": 0.0, "idle": 0.0})
        busy, idle = now["busy"] - was["busy"], now["idle"] - was["idle"]
        parts = {p: round((s - was["parts"].get(p, 0.0)) / wall_s, 2) for p, s in now["parts"].items()}
        out["nodes"][node] = {
            "parts": {p: v for p, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v > 0},
            "vm_busy_share": round(busy / (busy + idle), 2) if busy + idle > 0 else 0.0,
            "cpus": now["cpus"],
        }
    for name, s in after["host"].items():
        out["control_plane"][name] = round((s - before["host"].get(name, 0.0)) / wall_s, 2)
    if "machine" in after and "machine" in before:  # this host, which emulates every VM (TCG) and runs the rest
        busy = after["machine"]["busy"] - before["machine"]["busy"]
        idle = after["machine"]["idle"] - before["machine"]["idle"]
        out["host_busy_share"] = round(busy / (busy + idle), 2) if busy + idle > 0 else 0.0
    return out
