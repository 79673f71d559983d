"""Filesystems and block devices: probe, mkfs, grow, usage, size.

Contract: :meth:`Filesystems.probe` never writes; :meth:`Filesystems.make` refuses a device that already
carries a signature (the caller decides first, with ``probe``); sizes come from sysfs, not from tools.
Errors from commands raise ``CommandError``; an unsupported fsType raises ``InvalidArgument``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.errors import CommandError, FailedPrecondition, InvalidArgument, NotFound
from nvmeof_csi.host.executor import Executor

MKFS_TIMEOUT = 600.0
PROBE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Usage:
    """Filesystem usage in bytes and inodes."""

    total_bytes: int
    available_bytes: int
    used_bytes: int
    total_inodes: int
    free_inodes: int
    used_inodes: int


def device_size(device: str | Path, sys_root: Path = Path("/sys")) -> int:
    """Size in bytes of a block device, from ``/sys/dev/block/MAJ:MIN/size`` (512-byte sectors)."""
    try:
        st = os.stat(device)
    except FileNotFoundError as exc:
        raise NotFound(f"block device {device} does not exist") from exc
    if not stat.S_ISBLK(st.st_mode):
        raise FailedPrecondition(f"{device} is not a block device")
    node = sys_root / "dev" / "block" / f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" / "size"
    return int(node.read_text().strip()) * 512


def usage(path: str | Path) -> Usage:
    """Usage of the filesystem mounted at ``path``."""
    vfs = os.statvfs(path)
    total = vfs.f_blocks * vfs.f_frsize
    avail = vfs.f_bavail * vfs.f_frsize
    free = vfs.f_bfree * vfs.f_frsize
    return Usage(total, avail, total - free, vfs.f_files, vfs.f_ffree, vfs.f_files - vfs.f_ffree)


class Filesystems:
    """mkfs / probe / grow over an injected executor."""

    def __init__(self, executor: Executor) -> None:
        self._exec = executor

    def probe(self, device: str) -> str | None:
        """The signature type on ``device`` (``ext4``, ``xfs``, ``LVM2_member`` ...), or ``None`` when blank."""
        res = self._exec.run(
            ["blkid", "-p", "-u", "filesystem,raid,crypto,other", "-o", "value", "-s", "TYPE", device],
            timeout=PROBE_TIMEOUT,
            check=False,
        )
        if res.rc == 2:  # blkid: nothing found
            return None
        if res.rc != 0:
            raise CommandError(["blkid", "-p", device], res.rc, res.out, res.err)
        return res.out.strip() or None

    def make(self, device: str, fstype: str, options: Sequence[str] = ()) -> None:
        """Create ``fstype`` on a blank ``device``, with lazy initialisation where the filesystem has it."""
        if fstype == "ext4":
            argv = ["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", *options]
        elif fstype == "xfs":
            argv = ["mkfs.xfs", "-f", "-q", "-K", *options]
        else:
            raise InvalidArgument(f"cannot make a filesystem of type {fstype!r}")
        self._exec.run([*argv, device], timeout=MKFS_TIMEOUT)

    def make_from_tree(self, image: str | Path, tree: str | Path, label: str, timeout: float = MKFS_TIMEOUT) -> None:
        """Build ext4 holding the folder ``tree`` directly in the file or device ``image`` (``mkfs.ext4 -d``: no
        loop device, no mount), owned by root, with lazy initialisation. Overwrites what ``image`` held."""
        argv = ["mkfs.ext4", "-F", "-q", "-d", str(tree), "-L", label]
        self._exec.run(
            [*argv, "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", str(image)], timeout=timeout
        )

    def set_readonly(self, device: str, readonly: bool = True) -> None:
        """Make the block device refuse (or accept again) writes from anyone on this host (``BLKROSET``)."""
        self._exec.run(["blockdev", "--setro" if readonly else "--setrw", device], timeout=PROBE_TIMEOUT)

    def grow(self, device: str, mount_path: str, fstype: str) -> None:
        """Grow the mounted filesystem to fill its (already larger) device, online."""
        if fstype == "ext4":
            self._exec.run(["resize2fs", device], timeout=MKFS_TIMEOUT)
        elif fstype == "xfs":
            self._exec.run(["xfs_growfs", "-d", mount_path], timeout=MKFS_TIMEOUT)
        else:
            raise InvalidArgument(f"cannot grow filesystem type {fstype!r}")
