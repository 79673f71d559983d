"""DEVELOPMENT-ONLY connector of the loop backend (``nvmeof_csi.loop.backend``): "connecting" a volume attaches
its backing file with ``losetup``; devices are found through sysfs. It implements the ``Connector`` protocol of
``nvmeof_csi.service.contracts`` so the node's whole surface runs without NVMe-oF; never for real data.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from nvmeof_csi.errors import FailedPrecondition, NotFound
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.host.filesystems import device_size
from nvmeof_csi.loop.backend import CTX_PATH, LOSETUP_TIMEOUT
from nvmeof_csi.service.contracts import NO_SECRETS, Condition, Health, OrphanStats, VolumeRef


class LoopConnector:
    """Attaches a loop volume's backing file with ``losetup``; devices are found through sysfs."""

    def __init__(self, executor: Executor, sys_root: Path = Path("/sys")) -> None:
        self._exec = executor
        self._sys = sys_root
        self._known: dict[str, str] = {}  # backing file -> the device last found for it (checked on every use)

    def health(self) -> Health:
        if shutil.which("losetup") is None:
            return Health(False, "losetup is not installed")
        if not Path("/dev/loop-control").exists():
            return Health(False, "/dev/loop-control is missing (loop module not loaded)")
        return Health(True, "loop connector (development only)")

    def _devices_for(self, path: str) -> list[str]:
        """Every loop device backed by ``path``: one listing, one read per loop device (no glob)."""
        try:
            names = sorted(e.name for e in os.scandir(self._sys / "block") if e.name.startswith("loop"))
        except OSError:
            return []
        return ["/dev/" + name for name in names if self._backing(name) == path]

    def _device_for(self, path: str) -> str | None:
        """A loop device backed by ``path``: the one last found for it while it still is (one read), else a scan."""
        known = self._known.get(path)
        if known is not None and self._backing(known.removeprefix("/dev/")) == path:
            return known
        devices = self._devices_for(path)
        self._known.update({path: devices[0]} if devices else {})
        return devices[0] if devices else None

    def _backing(self, name: str) -> str:
        """The file behind loop device ``name``; "" when none (not attached, or gone mid-read). Plain ``os`` calls:
        a scan reads this for every loop device on the machine."""
        try:
            fd = os.open(f"{self._sys}/block/{name}/loop/backing_file", os.O_RDONLY)
        except OSError:
            return ""
        try:
            return os.fsdecode(os.read(fd, 8192)).strip()
        except OSError:
            return ""
        finally:
            os.close(fd)

    @staticmethod
    def _path(ref: VolumeRef, context: Mapping[str, str]) -> str:
        path = context.get(CTX_PATH)
        if not path:
            raise FailedPrecondition(f"volume {ref.uuid}: volume context has no {CTX_PATH!r} (not a loop volume)")
        return path

    def find_device(self, ref: VolumeRef, context: Mapping[str, str]) -> str | None:
        return self._device_for(self._path(ref, context))

    def connect(
        self, ref: VolumeRef, context: Mapping[str, str], timeout: float, secrets: Mapping[str, str] = NO_SECRETS
    ) -> str:
        path = self._path(ref, context)
        if (existing := self._device_for(path)) is not None:
            return existing
        if not Path(path).exists():
            raise NotFound(f"volume {ref.uuid}: backing file {path} does not exist")
        device = self._exec.run(
            ["losetup", "--find", "--show", path], timeout=min(timeout, LOSETUP_TIMEOUT)
        ).out.strip()
        self._known[path] = device
        return device

    def disconnect(self, ref: VolumeRef, context: Mapping[str, str], in_use: frozenset[VolumeRef]) -> None:
        """Detach the device this connector attached or found for the volume while it still is (one read), else
        every device a scan finds (after a restart)."""
        path = self._path(ref, context)
        known = self._known.pop(path, None)
        if known is not None and self._backing(known.removeprefix("/dev/")) == path:
            devices = [known]
        else:
            devices = self._devices_for(path)
        for device in devices:
            self._exec.run(["losetup", "-d", device], timeout=LOSETUP_TIMEOUT)

    def refresh_size(self, ref: VolumeRef, context: Mapping[str, str], device: str) -> int:
        self._exec.run(["losetup", "-c", device], timeout=LOSETUP_TIMEOUT)
        return device_size(device, self._sys)

    def check_context(self, ref: VolumeRef, context: Mapping[str, str]) -> None:
        self._path(ref, context)

    def refresh_keys(self, ref: VolumeRef, context: Mapping[str, str]) -> list[str]:
        return []

    def reconcile(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]], timeout: float) -> list[str]:
        """Re-attach staged volumes whose loop device is gone (e.g. after a reboot); orphans are not tracked."""
        actions = []
        for ref, context in claimed:
            if self.find_device(ref, context) is None and Path(self._path(ref, context)).exists():
                actions.append(f"re-attached {ref.uuid} as {self.connect(ref, context, timeout)}")
        return actions

    def head_of(self, ref: VolumeRef) -> str | None:
        return None  # a loop device is found by its backing file, which only the context names

    def release_volume(self, ref: VolumeRef, in_use: frozenset[VolumeRef]) -> list[str]:
        return []  # development only: a loop device left attached goes with the next reboot

    def retry_orphans(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]]) -> list[str]:
        return []  # orphans are not tracked

    def orphan_stats(self) -> OrphanStats:
        return OrphanStats()

    def condition(self, ref: VolumeRef, context: Mapping[str, str]) -> Condition:
        device = self.find_device(ref, context)
        return Condition(device is None, f"attached as {device}" if device else "loop device is not attached")
