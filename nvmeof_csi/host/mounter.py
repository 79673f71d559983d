"""Mounts: read from ``/proc/self/mountinfo``, changed with ``mount``/``umount`` argv commands; and the mount points
themselves (a folder for a filesystem, a file for a block device), made before a mount and removed after.

Contract: every method is idempotent with respect to the state it reaches (mounting what is already
mounted there is the caller's decision: :meth:`Mounter.mount_at` reports the existing mount). Errors from
the commands raise ``CommandError``. Not locked: callers hold the per-volume lock.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.errors import CommandError
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.host.mount_root import MountRoot, MountRoots, never

MOUNT_TIMEOUT = 120.0
_OCTAL = re.compile(r"\\([0-7]{3})")
_ESCAPED = frozenset(" \t\n\\")


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def escape_path(path: str) -> str:
    """``path`` as mountinfo writes it: the kernel escapes space, tab, newline and backslash as ``\\ooo``."""
    return "".join(f"\\{ord(c):03o}" if c in _ESCAPED else c for c in path)


@dataclass(frozen=True)
class MountInfo:
    """One line of mountinfo: ``root`` is the path inside the source filesystem (bind mounts)."""

    mount_point: str
    root: str
    device: str  # major:minor
    fstype: str
    source: str
    options: frozenset[str]

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Parse the mountinfo format (see proc(5)); malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        tail = right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        mounts.append(
            MountInfo(
                mount_point=_unescape(fields[4]),
                root=_unescape(fields[3]),
                device=fields[2],
                fstype=tail[0],
                source=_unescape(tail[1]),
                options=frozenset(fields[5].split(",")),
            )
        )
    return mounts


KERNEL_TABLE = Path("/proc/self/mountinfo")
MAX_STACKED = 64  # umounts at one path before giving up (each one must have taken a mount away)


class Mounter:
    """Mount operations over an injected :class:`Executor`; ``mountinfo`` path injectable for tests.

    Whether anything is mounted at a path is asked of the kernel first (``mount_root``: statx, see
    ``host/mount_root.py``), which costs one path lookup; the mount table, whose read costs every mount on the
    node, is read only when a mount's details are needed or the kernel cannot tell. ``mount_root`` defaults to
    statx when ``mountinfo`` is the kernel's own table, else to :func:`never` (a table file in a test)."""

    def __init__(self, executor: Executor, mountinfo: Path = KERNEL_TABLE, mount_root: MountRoot | None = None) -> None:
        self._exec = executor
        self._mountinfo = mountinfo
        self._mount_root = mount_root or (MountRoots() if mountinfo == KERNEL_TABLE else never)

    def mounts(self) -> list[MountInfo]:
        return parse_mountinfo(self._mountinfo.read_text())

    def _at(self, path: str | Path) -> list[MountInfo]:
        """Every mount at ``path`` (after resolving symlinks), bottom first; none without reading the table when
        the kernel says no mount's root is there. Only the lines that name the mount point are parsed: a node
        with hundreds of volumes has two mounts each."""
        target = os.path.realpath(path)
        if self._mount_root(target) is False:
            return []
        needle = f" {escape_path(target)} "
        lines = "\n".join(line for line in self._mountinfo.read_text().splitlines() if needle in line)
        return [info for info in parse_mountinfo(lines) if info.mount_point == target]

    def mount_at(self, path: str | Path) -> MountInfo | None:
        """The top-most mount at ``path`` (after resolving symlinks), or ``None``."""
        found = self._at(path)
        return found[-1] if found else None

    def mount(self, source: str, target: str | Path, fstype: str | None, options: Sequence[str] = ()) -> None:
        argv = ["mount"]
        if fstype:
            argv += ["-t", fstype]
        if options:
            argv += ["-o", ",".join(options)]
        self._exec.run([*argv, source, str(target)], timeout=MOUNT_TIMEOUT)

    def bind(self, source: str | Path, target: str | Path, readonly: bool, options: Sequence[str] = ()) -> None:
        """Bind-mount ``source`` on ``target``; a read-only bind needs a second remount step."""
        self._exec.run(["mount", "--bind", str(source), str(target)], timeout=MOUNT_TIMEOUT)
        extra = [o for o in options if o not in ("bind", "ro", "rw")]
        if readonly or extra:
            opts = ",".join(["remount", "bind", "ro" if readonly else "rw", *extra])
            self._exec.run(["mount", "-o", opts, str(target)], timeout=MOUNT_TIMEOUT)

    def unmount(self, target: str | Path) -> None:
        """Unmount every mount stacked at ``target``; nothing mounted is fine, and so is a mount another process
        took away meanwhile. Where the kernel tells whether a mount's root is there: ``umount`` until it is not
        (no table read); else one ``umount`` per mount the table lists there (one read of it)."""
        real = os.path.realpath(target)
        known = self._mount_root(real)
        if known is None:
            for _ in self._at(target):
                if not self._umount_once(target):
                    return
            return
        for _ in range(MAX_STACKED):
            if not known or not self._umount_once(target):
                return
            again = self._mount_root(real)
            known = again if again is not None else self.mount_at(target) is not None
        raise CommandError(["umount", str(target)], 1, "", f"still mounted after {MAX_STACKED} unmounts")

    def _umount_once(self, target: str | Path) -> bool:
        """One ``umount``; False when it failed because nothing is mounted there any more (taken away)."""
        try:
            self._exec.run(["umount", str(target)], timeout=MOUNT_TIMEOUT)
        except CommandError:
            if self.mount_at(target) is not None:
                raise
            return False
        return True

    @staticmethod
    def exists(path: str | Path) -> bool:
        """Whether anything is at ``path`` (a symlink counts by what it points to)."""
        return os.path.exists(path)

    @staticmethod
    def make_mount_point(path: str | Path, block: bool = False) -> None:
        """A folder at ``path`` (``block``: an empty file, for a bind-mounted device), its parents made too;
        one already there is fine."""
        target = Path(path)
        if block:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(exist_ok=True)
        else:
            target.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def remove_mount_point(path: str | Path) -> None:
        """Remove the (unmounted) folder or file at ``path``; absent is fine. A symlink is removed itself, never
        followed; a folder that is not empty raises ``OSError``."""
        target = Path(path)
        if target.is_dir() and not target.is_symlink():
            target.rmdir()
        elif target.exists() or target.is_symlink():
            target.unlink()
