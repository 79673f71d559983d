"""The NVMe-oF fabric lab: a QEMU VM booting Debian's stock kernel (real nvmet, nvme-tcp, nvme-rdma over
soft-RoCE, native multipath) with the host root shared read-only, driven from the host.

    python -m lab build               # idempotent: packages, kernel, initramfs (cached in .cache/lab)
    python -m lab run -- nvme version # boot, run argv commands in the guest, power off
"""

from lab.build import BuildError, BuildInfo, build
from lab.fabric import Fabric, PathState, Portal
from lab.host import lab_qemu_pids
from lab.probe import IoProbe, ProbeResult
from lab.vm import GuestError, GuestTimeout, LabError, LabVM, Result, VMExited

__all__ = [
    "BuildError",
    "BuildInfo",
    "Fabric",
    "GuestError",
    "GuestTimeout",
    "IoProbe",
    "LabError",
    "LabVM",
    "PathState",
    "Portal",
    "ProbeResult",
    "Result",
    "VMExited",
    "build",
    "lab_qemu_pids",
]
