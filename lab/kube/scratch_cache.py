"""The Kubernetes node's scratch disk with every image already imported, kept on this host between runs.

Importing the tier's images into containerd (gzip layers unpacked and digests checked, under TCG) is the
largest fixed cost of bringing the node up. The first run on a machine imports them and then saves the
scratch disk (containerd's content store, metadata and unpacked snapshots on XFS) to
``$NVMEOF_CSI_CACHE/kube/scratch-<key>.img``; a later run starts its VM from a copy of it, and containerd finds
the images there: a node whose image cache is warm, as on any real cluster. The driver's own image changes with
every commit, so it is left out of the key: a later run imports only it (one image instead of all) and does not
save the disk again for it. ``key`` hashes every other input of that disk: the other image tars (their paths
carry their content keys), containerd's binary, the lab kernel build,
the disk size and the source of this module and of :mod:`lab.kube.node` (how the node is prepared); a changed
input makes a new disk, and saving one removes the older ones.

On a machine without the disk (a fresh one, or a changed input), :func:`seed` makes it first, in one VM booted
alone for it: the three nodes each importing every image at once took 620 s, for a disk only one of them saves.

Contract: :func:`cached` returns the saved disk for ``key`` or ``None``; :func:`save` copies the running VM's
scratch disk while its filesystem is frozen (consistent, nothing half-written), written to a temp file and
renamed, so a run killed while saving leaves no disk behind that a later run would trust. A failure to save
is reported and changes nothing else (the next run imports again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from lab.build import BuildInfo
from lab.cluster import LabCluster
from lab.guest_calls import LabError
from lab.host import copy_disk
from lab.kube.build import binary, cache_root
from lab.kube.control_plane import ControlPlane, KubeError
from lab.kube.layout import KubeMachine
from lab.kube.node import KubeNode
from lab.vm import LabVM

HERE = Path(__file__).resolve().parent


def key(images: Mapping[str, Path], scratch_gb: int) -> str:
    """The cache key of a node disk of ``scratch_gb`` GiB with ``images`` (reference -> OCI tar) imported."""
    h = hashlib.sha256(f"{scratch_gb}\n{BuildInfo.load().inputs_sha256}\n".encode())
    for source in ("scratch_cache.py", "node.py"):
        h.update((HERE / source).read_bytes())
    ctrd = binary("containerd")
    h.update(f"{ctrd} {ctrd.stat().st_size}\n".encode())
    for ref, tar in sorted(images.items()):
        st = tar.stat()
        h.update(f"{ref} {tar} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _path(disk_key: str) -> Path:
    return cache_root() / f"scratch-{disk_key}.img"


def cached(disk_key: str) -> Path | None:
    path = _path(disk_key)
    return path if path.is_file() else None


def save(vm: LabVM, disk_key: str, mount: str = "/scratch") -> Path | None:
    """Copy ``vm``'s scratch disk (filesystem at ``mount``, frozen meanwhile) to the cache under ``disk_key``;
    returns the saved path, or ``None`` (reported) when it could not be saved."""
    final = _path(disk_key)
    tmp = final.with_name(f".{final.name}.tmp")
    froze = vm.run(["sh", "-c", f"sync && rm -f {mount}/.lab-host-identity && fsfreeze --freeze {mount}"], 120)
    if froze.rc:
        print(f"kube: the node disk is not saved (freeze failed: {froze.err.strip()})", flush=True)
        return None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        copied = copy_disk(vm.scratch, tmp)
    finally:
        vm.check(["fsfreeze", "--unfreeze", mount], timeout=120)
    if copied.returncode:
        tmp.unlink(missing_ok=True)
        print(f"kube: the node disk is not saved (cp: {copied.stderr.strip()})", flush=True)
        return None
    tmp.replace(final)
    for old in final.parent.glob("scratch-*.img"):
        if old != final:
            old.unlink(missing_ok=True)
    return final


def seed(
    cp: ControlPlane, machine: KubeMachine, images: Mapping[str, Path], disk_key: str, scratch_gb: int, nic: list[str]
) -> Path | None:
    """Boot ``machine`` alone (``nic``: its NIC to the API server), import ``images`` into its containerd, save its
    scratch disk under ``disk_key`` and stop it: the saved path, or ``None`` (reported) when that failed; then
    every node of the run starts from a copy, as on a warm machine."""
    lab = LabCluster([machine.spec], scratch_gb=scratch_gb, extra_nic=nic)
    try:
        lab.start()
        node = KubeNode(lab.vm(machine.name), cp, machine, images)
        imported = node.seed()
        print(f"kube: node disk seeded in one VM ({len(imported)} images imported)", flush=True)
        return save(node.vm, disk_key)
    except (LabError, KubeError) as exc:
        print(f"kube: the node disk could not be seeded, each node imports its own: {exc}", flush=True)
        return None
    finally:
        lab.close()
