"""The backing block device under a replica's DRBD resource: a loop device (direct I/O, so nothing is cached twice)
over the volume's file in the pool, reached through a link at a path that is the same on both nodes of the pair
(``replica_spec.disk_path``), so the one resource file both agents write names both disks.

Contract: :meth:`LoopLinks.attach` is idempotent (the loop already over the file is reused, the link replaced
atomically when it points elsewhere) and returns the link; :meth:`LoopLinks.detach` removes the link and
every loop over the file (nothing there: nothing done); :meth:`LoopLinks.refresh` makes the loop as large as its
file now is. A file the kernel cannot loop is ``FailedPrecondition`` naming the command's error. The link's name
comes from a checked volume UUID only, so it stays in ``DISK_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

from nvmeof_csi.agent.replica_spec import DISK_DIR, disk_path
from nvmeof_csi.errors import CommandError, FailedPrecondition
from nvmeof_csi.host.executor import Executor


class LoopLinks:
    def __init__(self, executor: Executor, link_dir: Path = Path(DISK_DIR), timeout: float = 30.0) -> None:
        """``link_dir``: where the links are (``DISK_DIR``, the folder the resource files name; a stand-in in
        tests)."""
        self._x, self._dir, self._timeout = executor, link_dir, timeout

    def link(self, vol_uuid: str) -> Path:
        return self._dir / Path(disk_path(vol_uuid)).name

    def _run(self, *argv: str) -> str:
        return self._x.run(list(argv), timeout=self._timeout, check=True).out

    def loops(self, backing: Path) -> list[str]:
        """The loop devices over ``backing``."""
        out = self._run("losetup", "--noheadings", "--output", "NAME", "--associated", str(backing))
        return [line.strip() for line in out.splitlines() if line.strip().startswith("/dev/loop")]

    def attach(self, vol_uuid: str, backing: Path) -> str:
        link = self.link(vol_uuid)
        try:
            found = self.loops(backing)
            if not found:
                self._run("modprobe", "loop")  # CONFIG_BLK_DEV_LOOP as a module: /dev/loop-control comes with it
            loop = found[0] if found else self._run("losetup", "--find", "--show", "--direct-io=on", str(backing))
        except CommandError as err:
            raise FailedPrecondition(f"could not make the loop device under replica {vol_uuid}: {err}") from err
        loop = loop.strip()
        if not link.is_symlink() or os.readlink(link) != loop:
            link.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            temp = link.with_name(f".{link.name}.new")
            temp.unlink(missing_ok=True)
            temp.symlink_to(loop)
            temp.replace(link)
        return str(link)

    def detach(self, vol_uuid: str, backing: Path) -> None:
        self.link(vol_uuid).unlink(missing_ok=True)
        if backing.exists():
            for loop in self.loops(backing):
                self._run("losetup", "--detach", loop)

    def refresh(self, backing: Path) -> None:
        for loop in self.loops(backing):
            self._run("losetup", "--set-capacity", loop)


__all__ = ["LoopLinks"]
