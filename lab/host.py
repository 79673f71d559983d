"""Host-side facts about lab QEMU processes: is KVM usable, which lab QEMUs run, and tying a QEMU's life to
the Python process that started it (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

VM_NAME = "nvmeof-csi-lab"
PR_SET_PDEATHSIG = 1


def kvm_usable() -> bool:
    """KVM with hardware virtualisation. A PVM host (kvm_pvm) cannot run a stock kernel: use TCG there."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    return any(Path("/sys/module", m).is_dir() for m in ("kvm_intel", "kvm_amd"))


def die_with_parent() -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def lab_qemu_pids(parent: int | None = None) -> list[int]:
    """PIDs of running lab QEMUs on this host (found by the VM name in their command line); with ``parent``,
    only those that process started."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        ours = cmdline and cmdline[0].endswith(b"qemu-system-x86_64") and VM_NAME.encode() in cmdline
        if ours and (parent is None or ppid == parent):
            pids.append(int(proc.name))
    return pids


def copy_disk(source: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """``cp`` of a disk image that keeps it sparse (a reflink where the filesystem offers one); the finished
    process, stderr captured, not checked."""
    return subprocess.run(
        ["cp", "--sparse=always", "--reflink=auto", str(source), str(target)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
