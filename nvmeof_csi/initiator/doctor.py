"""``nvmeofctl doctor``: is this GPU node ready for NVMe-oF volumes? Each check passes or fails with the fix.

Checks: the fabrics modules (nvme-fabrics, nvme-tcp; nvme-rdma when the node has RDMA devices), native NVMe
multipath on, ``/etc/nvme/hostnqn`` and ``hostid`` present, valid, not all-zero and agreeing with each other,
not shared with another node (when given the other nodes' identities), nvme-cli present and recent enough,
RDMA devices (informational unless required), the cgroup v2 io controller (per-pod I/O limits), and each
StorageClass feature (``initiator/features.py``; failed only when required).

Contract: :func:`diagnose` never raises; it reads only the roots it is given (``sys_root``, ``etc_dir``,
``cgroup_root``) and runs ``nvme version`` through the injected executor.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.initiator.features import FEATURES, NodeFeatures
from nvmeof_csi.initiator.identity import ZERO, HostIdentity

MIN_NVME_CLI = (2, 0)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    absent: bool = False  # ok, but what it checks is missing (an optional feature)


def read_value(path: Path) -> str:
    """A sysfs or config file's text, stripped; "" when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _module(sys_root: Path, name: str) -> bool:
    return (sys_root / "module" / name).exists()


def check_modules(sys_root: Path, rdma: bool) -> list[Check]:
    wanted = ["nvme_core", "nvme_fabrics", "nvme_tcp", *(["nvme_rdma"] if rdma else [])]
    missing = [m for m in wanted if not _module(sys_root, m)]
    if missing:
        return [
            Check(
                "modules",
                False,
                f"not loaded: {', '.join(missing)}",
                f"modprobe {' '.join(m.replace('_', '-') for m in missing)}; list them in /etc/modules-load.d/",
            )
        ]
    return [Check("modules", True, f"loaded: {', '.join(wanted)}")]


def check_multipath(sys_root: Path) -> Check:
    value = read_value(sys_root / "module" / "nvme_core" / "parameters" / "multipath")
    if value == "Y":
        return Check("native multipath", True, "nvme_core.multipath=Y")
    return Check(
        "native multipath",
        False,
        f"nvme_core.multipath={value or 'unknown (nvme_core not loaded)'}",
        "boot with nvme_core.multipath=Y (or 'options nvme_core multipath=Y' in /etc/modprobe.d) and reload "
        "nvme_core; without it a volume's paths are separate disks and failover does not work",
    )


def check_identity(etc_dir: Path, peers: Iterable[str]) -> list[Check]:
    nqn, host_id = read_value(etc_dir / "hostnqn"), read_value(etc_dir / "hostid")
    identity = HostIdentity(nqn, host_id)
    fix = (
        "remove /etc/nvme/hostnqn and /etc/nvme/hostid and restart the node plugin (it generates a fresh pair), "
        "or run: nvme gen-hostnqn > /etc/nvme/hostnqn"
    )
    if not nqn or not host_id:
        return [Check("host identity", False, f"missing: {'hostnqn' if not nqn else 'hostid'} in {etc_dir}", fix)]
    if host_id.lower() == ZERO or nqn.endswith(ZERO):
        return [Check("host identity", False, "all-zero host ID or NQN (an image without a machine UUID)", fix)]
    if not identity.valid():
        return [Check("host identity", False, f"host NQN {nqn!r} and host ID {host_id!r} are invalid or disagree", fix)]
    checks = [Check("host identity", True, f"{nqn} (host ID {host_id})")]
    taken = {p.strip().lower() for p in peers if p.strip()}
    shared = [x for x in (nqn, host_id) if x.lower() in taken]
    if shared:
        checks.append(
            Check(
                "identity unique",
                False,
                f"another node uses {', '.join(shared)}: volumes published to it are reachable from this node",
                fix,
            )
        )
    elif taken:
        checks.append(Check("identity unique", True, f"not among {len(taken)} identities of other nodes"))
    return checks


def check_nvme_cli(executor: Executor) -> Check:
    fix = "apt-get install nvme-cli (version 2.x or later)"
    try:
        out = executor.run(["nvme", "version"], timeout=10).out
    except DriverError as exc:
        return Check("nvme-cli", False, f"nvme version failed: {exc}", fix)
    found = re.search(r"(\d+)\.(\d+)", out)
    if found is None:
        return Check("nvme-cli", False, f"cannot read the version from {out.strip()[:80]!r}", fix)
    version = (int(found.group(1)), int(found.group(2)))
    if version < MIN_NVME_CLI:
        return Check("nvme-cli", False, f"version {found.group(0)} is older than 2.0", fix)
    return Check("nvme-cli", True, f"version {found.group(0)}")


def rdma_devices(sys_root: Path) -> list[str]:
    folder = sys_root / "class" / "infiniband"
    try:
        return sorted(p.name for p in folder.iterdir())
    except OSError:
        return []


def check_rdma(sys_root: Path, required: bool) -> Check:
    devices = rdma_devices(sys_root)
    if devices:
        return Check("RDMA devices", True, ", ".join(devices))
    return Check(
        "RDMA devices",
        not required,
        "none (NVMe/TCP only)",
        "load the RDMA NIC's driver (or rdma_rxe / siw for soft RoCE / iWARP)" if required else "",
    )


def check_io_controller(cgroup_root: Path) -> Check:
    available, why = PodCgroups(cgroup_root).io_controller()
    if available:
        return Check("cgroup v2 io controller", True, f"available at {cgroup_root}")
    return Check(
        "cgroup v2 io controller",
        False,
        why,
        "boot with systemd.unified_cgroup_hierarchy=1 (cgroup v2) "
        "and run kubelet with it; without it per-pod IOPS / bandwidth limits are not enforced",
    )


def check_features(features: NodeFeatures, required: Iterable[str]) -> list[Check]:
    """One check per StorageClass feature (``initiator/features.py``): failed only when missing and ``required``
    (a feature no StorageClass asks of this node may be missing)."""
    needed = set(required)
    checks = []
    for name in FEATURES:
        gap = features.gap(name)
        if gap is None:
            checks.append(Check(f"feature {name}", True, "available"))
        else:
            note = "" if name in needed else " (fine unless a StorageClass asks for it: --feature to require it)"
            checks.append(Check(f"feature {name}", name not in needed, gap.why + note, gap.fix, absent=True))
    return checks


def diagnose(
    executor: Executor,
    sys_root: Path = Path("/sys"),
    etc_dir: Path = Path("/etc/nvme"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    peers: Iterable[str] = (),
    require_rdma: bool = False,
    features: NodeFeatures | None = None,
    required: Iterable[str] = (),
) -> list[Check]:
    rdma = bool(rdma_devices(sys_root))
    return [
        *(check_features(features, required) if features is not None else []),
        *check_modules(sys_root, rdma),
        check_multipath(sys_root),
        *check_identity(etc_dir, peers),
        check_nvme_cli(executor),
        check_rdma(sys_root, require_rdma),
        check_io_controller(cgroup_root),
    ]
