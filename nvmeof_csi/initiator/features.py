"""What each StorageClass feature needs of a GPU node, checked rather than assumed: before a volume is connected
(NodeStage refuses with FAILED_PRECONDITION naming what is missing and the fix), in NodeGetStorageHealth (for
every feature this node was asked for), and by ``nvmeofctl doctor`` (every feature).

| feature | asked for by | needs on the node |
|---|---|---|
| ``tcp`` | ``transport: tcp`` | the ``nvme-tcp`` module, loaded or installed (the kernel loads it at connect) |
| ``rdma`` | ``transport: rdma`` | the ``nvme-rdma`` module and an RDMA device (a RoCE/InfiniBand NIC, soft RoCE) |
| ``multipath`` | a volume with more than one portal | native NVMe multipath (``nvme_core.multipath=Y``) |
| ``dhchap`` | ``auth: dhchap`` or ``dhchap-bidirectional`` | NVMe in-band authentication (``CONFIG_NVME_HOST_AUTH``) |
| ``tls`` | ``tls: psk`` | NVMe/TCP TLS (``CONFIG_NVME_TCP_TLS``) and a running ``tlshd`` |
| ``qos`` | any I/O limit (``readIops`` ...) | the cgroup v2 ``io`` controller |

Contract: :func:`features_of` is a pure function of a volume context; :meth:`NodeFeatures.gap` only reads the roots
it is given and never raises (a feature it does not know is reported missing); :meth:`NodeFeatures.check` raises
``FailedPrecondition`` naming every missing feature and its fix, and remembers what was asked for
(:meth:`NodeFeatures.asked_gaps`: what NodeGetStorageHealth reports). Thread-safe.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.nvmeof.context import VolumeContext
from nvmeof_csi.nvmeof.qos import UNLIMITED

MODULES_LOAD = "/etc/modules-load.d/nvmeof-csi.conf"
FEATURES = ("tcp", "rdma", "multipath", "dhchap", "tls", "qos")


@dataclass(frozen=True)
class Gap:
    """A feature this node cannot serve now: why, and the fix."""

    feature: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.feature}: {self.why} (fix: {self.fix})"


def features_of(ctx: VolumeContext) -> frozenset[str]:
    """The features a volume asks of the node that stages it."""
    wanted = {p.trtype for p in ctx.portals} or {ctx.transport}  # the transports its paths are connected over
    if len(ctx.portals) > 1:
        wanted.add("multipath")
    if ctx.auth != "none":
        wanted.add("dhchap")
    if ctx.tls != "none":
        wanted.add("tls")
    if ctx.qos != UNLIMITED:
        wanted.add("qos")
    return frozenset(wanted)


class NodeFeatures:
    def __init__(
        self,
        sys_root: Path = Path("/sys"),
        modules_root: Path = Path("/lib/modules"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        authenticates: Callable[[], bool] = lambda: False,
        release: Callable[[], str] = lambda: os.uname().release,
        tls_capable: Callable[[], bool] = lambda: False,
        handshake_daemon: Callable[[], bool] = lambda: False,
    ) -> None:
        self._sys, self._modules, self._cgroups = sys_root, modules_root, cgroup_root
        self._authenticates, self._release = authenticates, release
        self._tls_capable, self._handshake_daemon = tls_capable, handshake_daemon
        self._asked: set[str] = set()
        self._lock = threading.Lock()

    def gap(self, feature: str) -> Gap | None:
        """Why this node cannot serve ``feature`` now (``None``: it can)."""
        release = self._release()
        if feature in ("tcp", "rdma") and not self._module(f"nvme_{feature}"):
            dash = f"nvme-{feature}"
            why = f"the {dash} module is neither loaded nor installed for kernel {release}"
            return Gap(
                feature, why, f"install the kernel's modules, then: modprobe {dash}; echo {dash} >> {MODULES_LOAD}"
            )
        if feature == "rdma" and not self._rdma_devices():
            return Gap(
                feature, "no RDMA device (/sys/class/infiniband is empty)", "load the RDMA NIC's driver, or rdma_rxe"
            )
        if feature == "multipath":
            value = self._read(self._sys / "module" / "nvme_core" / "parameters" / "multipath")
            if value != "Y":
                why = f"native NVMe multipath is off (nvme_core.multipath={value or 'unknown'})"
                return Gap(
                    feature, why, "boot with nvme_core.multipath=Y ('options nvme_core multipath=Y' in modprobe.d)"
                )
        if feature == "dhchap" and not self._authenticates():
            why = f"kernel {release} has no NVMe in-band authentication (CONFIG_NVME_HOST_AUTH)"
            return Gap(feature, why, "run a kernel built with it (6.1 and later, e.g. Debian's 6.12)")
        if feature == "tls" and not self._tls_capable():
            why = f"kernel {release} cannot connect with NVMe/TCP TLS (CONFIG_NVME_TCP_TLS)"
            return Gap(feature, why, "run a kernel built with it (6.7 and later, e.g. Debian's 6.12)")
        if feature == "tls" and not self._handshake_daemon():
            why = "no TLS handshake daemon (tlshd) runs beside the node plugin"
            return Gap(feature, why, "run tlshd with keyrings=.nvme (chart: nvmeTls.handshakeDaemon: true)")
        if feature == "qos":
            available, why = PodCgroups(self._cgroups).io_controller()
            if not available:
                return Gap(feature, why, "boot with systemd.unified_cgroup_hierarchy=1 and run kubelet on cgroup v2")
        if feature not in FEATURES:
            return Gap(feature, "not a feature this node plugin knows", "upgrade the node plugin")
        return None

    def check(self, vol_uuid: str, ctx: VolumeContext, single_path: bool = False) -> None:
        """Refuse a volume whose features this node lacks (I/O limits excepted: the publish reports those as not
        enforced; multipath excepted where single-path staging is allowed)."""
        wanted = features_of(ctx) - {"qos", *(["multipath"] if single_path else [])}
        with self._lock:
            self._asked |= wanted
        gaps = self.gaps(tuple(wanted))
        if gaps:
            raise FailedPrecondition(f"volume {vol_uuid} cannot be staged on this node: {'; '.join(map(str, gaps))}")

    def asked_gaps(self) -> tuple[str, ...]:
        """What this node lacks of the features volumes asked of it since it started (each with its fix)."""
        with self._lock:
            asked = tuple(self._asked)
        return tuple(map(str, self.gaps(asked)))

    def gaps(self, features: tuple[str, ...]) -> list[Gap]:
        return [g for f in sorted(features) if (g := self.gap(f)) is not None]

    def _module(self, name: str) -> bool:
        if (self._sys / "module" / name).is_dir():
            return True
        release = self._release()
        dash = name.replace("_", "-")
        for listing in ("modules.dep", "modules.builtin"):
            text = self._read(self._modules / release / listing)
            if any(f"/{dash}.ko" in line.split(":", 1)[0] for line in text.splitlines()):
                return True
        return False

    def _rdma_devices(self) -> bool:
        try:
            return any((self._sys / "class" / "infiniband").iterdir())
        except OSError:
            return False

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text().strip()
        except OSError:
            return ""


def rdma_capable(sys_root: Path = Path("/sys")) -> bool:
    """True when the node has an RDMA device (``/sys/class/infiniband`` is not empty)."""
    folder = sys_root / "class" / "infiniband"
    try:
        return any(folder.iterdir())
    except OSError:
        return False
