"""Backing store ``file``: each volume is a sparse file on the pool's filesystem; snapshots and clones are
reflinks (instant and space-sharing on XFS with reflink; a sparse copy elsewhere).

Contract: every method is idempotent; files appear atomically (written under a temporary name, then
renamed), so a crash leaves either the complete file or none, plus at most a ``*.tmp`` that
:meth:`FileStore.sweep_temp` removes. Sizes only grow. Not locked: the agent locks per volume.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.errors import NotFound, ResourceExhausted
from nvmeof_csi.host.atomic import fsync_dir
from nvmeof_csi.host.paths import child
from nvmeof_csi.nvmeof.nqn import check_uuid

FICLONE = 0x40049409  # _IOW(0x94, 9, int)
COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class PoolUsage:
    total_bytes: int
    free_bytes: int  # what the agent may still write (available to it)
    used_bytes: int = 0

    @property
    def used_percent(self) -> float:
        """How full the pool is, as ``df`` reports it: used / (used + available)."""
        room = self.used_bytes + self.free_bytes
        return 100.0 * self.used_bytes / room if room else 0.0


class FileStore:
    """Volumes in ``pool/volumes/<uuid>.img``, snapshots in ``pool/snapshots/<uuid>.img``."""

    def __init__(self, pool: Path) -> None:
        self.pool = pool
        self.volumes = pool / "volumes"
        self.snapshots = pool / "snapshots"

    def prepare(self) -> None:
        for folder in (self.volumes, self.snapshots):
            folder.mkdir(parents=True, exist_ok=True)

    def volume_path(self, vol_uuid: str) -> Path:
        """The backing file of a volume; ``InvalidArgument`` unless ``vol_uuid`` is a canonical UUID."""
        return child(self.volumes, f"{check_uuid(vol_uuid, 'volume UUID')}.img", "volume UUID")

    def snapshot_path(self, snap_uuid: str) -> Path:
        """The file of a snapshot; ``InvalidArgument`` unless ``snap_uuid`` is a canonical UUID."""
        return child(self.snapshots, f"{check_uuid(snap_uuid, 'snapshot UUID')}.img", "snapshot UUID")

    def usage(self) -> PoolUsage:
        du = shutil.disk_usage(self.pool)
        return PoolUsage(du.total, du.free, du.used)

    def create(self, path: Path, size: int) -> None:
        """A sparse file of ``size`` bytes (an existing file is grown to ``size``, never shrunk)."""
        if path.exists():
            self.grow(path, size)
            return
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as handle:
            os.ftruncate(handle.fileno(), size)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def grow(self, path: Path, size: int) -> int:
        """Extend ``path`` to ``size`` if it is smaller; returns the resulting size."""
        try:
            current = path.stat().st_size
        except FileNotFoundError as exc:
            raise NotFound(f"backing file {path} does not exist") from exc
        if size > current:
            with open(path, "r+b") as handle:
                os.ftruncate(handle.fileno(), size)
                os.fsync(handle.fileno())
            return size
        return current

    def clone(self, source: Path, target: Path, size: int) -> bool:
        """``target`` as a copy of ``source`` grown to ``size``; True when it was a reflink (no data copied)."""
        if target.exists():
            self.grow(target, size)
            return True
        if not source.exists():
            raise NotFound(f"clone source {source} does not exist")
        tmp = target.with_suffix(".tmp")
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            try:
                fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
                reflinked = True
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                    raise
                reflinked = False
                self._sparse_copy(src.fileno(), dst.fileno())
            if size > os.fstat(dst.fileno()).st_size:
                os.ftruncate(dst.fileno(), size)
            os.fsync(dst.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
        return reflinked

    @staticmethod
    def _sparse_copy(src: int, dst: int) -> None:
        """Copy only the data extents (holes stay holes)."""
        end = os.fstat(src).st_size
        os.ftruncate(dst, end)
        offset = 0
        while offset < end:
            try:
                data = os.lseek(src, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    return  # only a hole remains
                raise
            hole = os.lseek(src, data, os.SEEK_HOLE)
            while data < hole:
                chunk = os.pread(src, min(COPY_CHUNK, hole - data), data)
                os.pwrite(dst, chunk, data)
                data += len(chunk)
            offset = hole

    def delete(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(path.parent)

    def files(self) -> list[Path]:
        """Every image file in the pool (volumes and snapshots)."""
        return sorted([*self.volumes.glob("*.img"), *self.snapshots.glob("*.img")])

    def sweep_temp(self) -> list[Path]:
        """Remove leftovers of interrupted creates/clones (always ours, never complete); returns them."""
        gone = sorted([*self.volumes.glob("*.tmp"), *self.snapshots.glob("*.tmp")])
        for path in gone:
            path.unlink(missing_ok=True)
        return gone

    def check_space(self, wanted: int, provisioned: int, limit: int, high_water: float = 100.0) -> None:
        """Thin provisioning: at most ``limit`` bytes may be provisioned in all; and nothing new once the pool's
        filesystem is ``high_water`` percent full, so that the volumes already there can still be written."""
        if provisioned + wanted > limit:
            raise ResourceExhausted(
                f"pool {self.pool}: {limit - provisioned} of {limit} bytes left to provision, {wanted} requested"
            )
        used = self.usage().used_percent
        if used >= high_water:
            raise ResourceExhausted(
                f"pool {self.pool} is {used:.0f}% full (high-water mark {high_water:g}%): no new volume, snapshot or "
                "clone until space is freed; the volumes already there keep working"
            )
