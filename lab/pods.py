"""Stand-ins for kubelet's pod cgroups in the lab VM (cgroup v2): the folders kubelet makes for a pod, with the
io controller enabled down to them, and programs run inside one (what a pod's container would issue).

Contract: :func:`make_pod` returns the pod cgroup's path (systemd or cgroupfs layout, any QoS class);
:func:`in_pod` wraps an argv so it runs in that cgroup; :func:`remove_pod` removes the pod's folder once
nothing runs in it (as kubelet does when a pod ends).
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.vm import LabVM

ROOT = "/sys/fs/cgroup"


def pod_path(uid: str, qos: str = "burstable", driver: str = "systemd") -> str:
    if driver == "cgroupfs":
        return f"{ROOT}/kubepods/{qos}/pod{uid}" if qos else f"{ROOT}/kubepods/pod{uid}"
    under = uid.replace("-", "_")
    if not qos:
        return f"{ROOT}/kubepods.slice/kubepods-pod{under}.slice"
    return f"{ROOT}/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice"


def make_pod(vm: LabVM, uid: str, qos: str = "burstable", driver: str = "systemd") -> str:
    path = pod_path(uid, qos, driver)
    parts = path[len(ROOT) + 1 :].split("/")
    folder = ROOT
    for part in parts:  # enable io (and the writeback pair, memory) for the children of every level
        vm.check(["sh", "-c", f"echo '+io +memory' > {folder}/cgroup.subtree_control"], timeout=30)
        folder = f"{folder}/{part}"
        vm.mkdir(folder)
    return path


def in_pod(path: str, argv: Sequence[str]) -> list[str]:
    return ["sh", "-c", f'echo $$ > {path}/cgroup.procs && exec "$@"', "in-pod", *argv]


def remove_pod(vm: LabVM, path: str) -> None:
    vm.run(["rmdir", path], 30)
