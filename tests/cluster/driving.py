"""How the cluster tier's driver tests drive the GPU nodes: CSI steps in a node's VM (``lab.csi_ops``), by volume
name, and what they read back."""

from __future__ import annotations

from typing import Any

from lab.cluster_driver import ClusterDriver

WORK = "/run/nvmeof-csi/lab/volumes"  # lab.csi_ops.WORK: <name>/mount or <name>/device
UP = ("create", "attach", "stage", "publish")
OFF = ("unpublish", "unstage", "detach")


def csi(stack: ClusterDriver, node: str, *steps: dict[str, Any]) -> list[dict[str, Any]]:
    return stack.drivers[node].csi(*steps)


def on(name: str, *ops: str, **first: Any) -> list[dict[str, Any]]:
    """Steps ``ops`` on volume ``name`` (``first``'s arguments go to the first step)."""
    return [{"op": op, "name": name, **(first if i == 0 else {})} for i, op in enumerate(ops)]


def files_sha256(stack: ClusterDriver, node: str, folder: str) -> dict[str, str]:
    vm = stack.cluster.vm(node)
    names = sorted(vm.listdir(folder))
    out = vm.check(["sha256sum", *(f"{folder}/{n}" for n in names)], timeout=120)
    return {line.split()[1].rsplit("/", 1)[1]: line.split()[0] for line in out.splitlines()}


def uuid_of(volume_id: str) -> str:
    return volume_id.rsplit(".", 1)[1]
