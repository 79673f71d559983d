"""Read-only access enforced by the target, not by the host's good will.

nvmet opens every namespace read-write and checks a host only when it connects; it has no per-host read-only
mode. So a host granted read-only is never allowed on the volume's own subsystem. A volume with read-only hosts
gets a second subsystem, ``<volume NQN>:ro`` (``nvmeof/nqn.py``), whose one namespace is a block device that
refuses every write: a loop device (direct I/O) over the volume's backing file under a device-mapper
``flakey`` target that is always "down" with ``error_writes``. Reads pass through to the same file with
``O_DIRECT``, so a read-only host sees what the writers wrote (no copy, nothing stale); writes, flushes and
discards end with an I/O error before they reach the file. Read-write hosts are allowed only on the volume's
own subsystem. The read-only namespace has its own UUID and NGUID.

Contract:
- ``ReadOnlyExports`` (``agent/readonly_exports.py``) ``ensure(rec)`` makes the read-only subsystem match
  ``rec.readonly_hosts`` (removes it and its devices when there are none); ``remove(rec)`` removes it and its
  devices (a device left by a crash between the two goes at the next ``remove`` or with the reboot that configfs
  needs anyway); ``refresh(rec)`` after the backing file grew; ``drift(rec)`` says why configfs differs (""
  when it agrees). All idempotent; callers hold the volume's key.
- :class:`ReadOnlyDevices` implementations: :class:`KernelReadOnlyDevices` (losetup, dmsetup, modprobe; a kernel
  without ``dm-flakey`` is ``FailedPrecondition`` naming the module) and :class:`PlainReadOnlyDevices` (plain
  configfs trees in tests: the backing file's path, no kernel). Without devices, a read-only grant is
  ``FailedPrecondition``: never a namespace that accepts writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from nvmeof_csi.errors import CommandError, FailedPrecondition
from nvmeof_csi.host.executor import Executor

NSID = 1
MODEL = "nvmeof-csi"
DM_PREFIX = "nvmeof-ro-"
NO_FLAKEY = (
    "read-only access is enforced by the target through device-mapper's flakey target (error_writes), and "
    "this storage node cannot load it (modules loop and dm-flakey: CONFIG_BLK_DEV_LOOP, CONFIG_DM_FLAKEY)"
)


class ReadOnlyDevices(Protocol):
    def attach(self, name: str, backing: Path) -> str:
        """A block device path over ``backing`` that refuses writes (made once; the same path again)."""

    def detach(self, name: str, backing: Path) -> None:
        """Remove what :meth:`attach` made (nothing there: nothing done)."""

    def refresh(self, name: str, backing: Path) -> None:
        """Make the device as large as ``backing`` is now."""


class PlainReadOnlyDevices:
    """For plain configfs trees (tests without a kernel): the backing file's own path."""

    def attach(self, name: str, backing: Path) -> str:
        return str(backing)

    def detach(self, name: str, backing: Path) -> None:
        return None

    def refresh(self, name: str, backing: Path) -> None:
        return None


class KernelReadOnlyDevices:
    """loop (direct I/O) + dm-flakey ``error_writes`` through ``losetup`` and ``dmsetup``."""

    def __init__(self, executor: Executor, timeout: float = 30.0) -> None:
        self._x, self._timeout = executor, timeout

    def _run(self, *argv: str) -> str:
        return self._x.run(list(argv), timeout=self._timeout, check=True).out

    def _dm_device(self, dm: str) -> str:
        """``/dev/dm-N`` of map ``dm`` (devtmpfs makes it, udev or not), or "" when there is no such map."""
        argv = ["dmsetup", "info", "-c", "--noheadings", "-o", "blkdevname", dm]
        result = self._x.run(argv, timeout=self._timeout, check=False)
        name = result.out.strip()
        return f"/dev/{name}" if result.rc == 0 and name.startswith("dm-") else ""

    def _loops(self, backing: Path) -> list[str]:
        out = self._run("losetup", "--noheadings", "--output", "NAME", "--associated", str(backing))
        return [line.strip() for line in out.splitlines() if line.strip().startswith("/dev/loop")]

    def _table(self, loop: str) -> str:
        sectors = int(self._run("blockdev", "--getsz", loop).strip())
        return f"0 {sectors} flakey {loop} 0 0 1 1 error_writes"  # up 0 s, down 1 s: always down

    def attach(self, name: str, backing: Path) -> str:
        dm = DM_PREFIX + name
        found = self._dm_device(dm)
        if found:
            return found
        try:
            self._run("modprobe", "--all", "loop", "dm-flakey")
        except CommandError as err:
            raise FailedPrecondition(f"{NO_FLAKEY}: {err}") from err
        try:
            loops = self._loops(backing)
            loop = loops[0] if loops else self._run("losetup", "--find", "--show", "--direct-io=on", str(backing))
            self._run("dmsetup", "create", "--noudevsync", dm, "--table", self._table(loop.strip()))
        except CommandError as err:
            raise FailedPrecondition(f"could not make the read-only device of {backing.name}: {err}") from err
        found = self._dm_device(dm)
        if not found:
            raise FailedPrecondition(f"device-mapper map {dm} was made but has no /dev/dm-N node")
        return found

    def detach(self, name: str, backing: Path) -> None:
        dm = DM_PREFIX + name
        if self._dm_device(dm):
            self._run("dmsetup", "remove", "--noudevsync", "--retry", dm)
        if backing.exists():
            for loop in self._loops(backing):
                self._run("losetup", "--detach", loop)

    def refresh(self, name: str, backing: Path) -> None:
        dm = DM_PREFIX + name
        loops = self._loops(backing)
        if not self._dm_device(dm) or not loops:
            return
        self._run("losetup", "--set-capacity", loops[0])
        self._run("dmsetup", "reload", "--noudevsync", dm, "--table", self._table(loops[0]))
        self._run("dmsetup", "resume", "--noudevsync", dm)
