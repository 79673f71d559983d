"""The DRBD resources of this agent's replicated volumes: one resource file per volume (``agent/drbd_config.py``)
under the agent's own folder, driven by drbd-utils' ``drbdadm-84`` pointed at that file (``-c``: no global
``/etc/drbd.conf``), the kernel's state read from ``/proc/drbd`` (``agent/drbd_status.py``).

Contract:
- Every command names the resource by :func:`~nvmeof_csi.agent.drbd_config.resource_name` of a checked volume
  UUID, so a file path built from it stays under ``conf_dir``; the file is owner-only (it holds the peers'
  shared secret).
- The shared secret never reaches a log or an error: drbdadm passes it on drbdsetup's command line and prints
  failing commands, so every command's argv, output and error are redacted before they are raised.
- :meth:`DrbdResources.promote` never forces: DRBD itself refuses a replica that is not UpToDate (an Outdated
  or Inconsistent one), and that refusal is raised as ``FailedPrecondition``. Only a brand-new pair skips its
  initial sync (:meth:`~DrbdResources.skip_initial_sync`: both disks are fresh, all zeroes), and only the
  controller's directed split-brain resolution discards a replica's data (:meth:`~DrbdResources.discard_mine`).
- :meth:`~DrbdResources.resize` returns once the device has grown to the size asked: a Primary's device grows
  only when its peer has answered with its own grown backing size (a round trip after ``drbdadm resize``);
  ``Unavailable`` when it has not within ``grow_wait`` seconds (a retry asks again).
- :meth:`~DrbdResources.up` is idempotent (``adjust`` when the minor is configured already), as is
  :meth:`~DrbdResources.down` (a resource already gone is not an error).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from nvmeof_csi.agent.drbd_config import resource_name
from nvmeof_csi.agent.drbd_status import DrbdState, parse_proc_drbd
from nvmeof_csi.errors import CommandError, FailedPrecondition, Unavailable
from nvmeof_csi.host.atomic import write_atomic
from nvmeof_csi.host.executor import Executor

log = logging.getLogger(__name__)

DRBDADM = "/usr/lib/drbd/drbdadm-84"  # drbd-utils 9.x keeps the 8.4 tools (the kernel's in-tree DRBD) here
PROC_DRBD = Path("/proc/drbd")
_NOT_UP_TO_DATE = ("Need access to UpToDate data", "Refusing to be Primary", "state change failed")


class DrbdResources:
    def __init__(
        self,
        executor: Executor,
        conf_dir: Path,
        adm: str = DRBDADM,
        read_proc: Callable[[], str] = PROC_DRBD.read_text,
        timeout: float = 60.0,
        device_bytes: Callable[[int], int] | None = None,
        grow_wait: float = 30.0,
    ) -> None:
        """``conf_dir``: the agent's folder for resource files (made owner-only on first write); ``read_proc``
        gives ``/proc/drbd``'s text and ``device_bytes`` a minor's size from sysfs (stand-ins in tests)."""
        self._run, self._dir, self._adm = executor.run, conf_dir, adm
        self._read_proc, self._timeout = read_proc, timeout
        self._device_bytes = device_bytes or _sysfs_bytes
        self._grow_wait = grow_wait

    def path(self, vol_uuid: str) -> Path:
        return self._dir / f"{resource_name(vol_uuid)}.res"

    def write(self, vol_uuid: str, text: str) -> None:
        """The volume's resource file, replaced atomically (``text`` from ``drbd_config.resource_text``)."""
        path = self.path(vol_uuid)  # the UUID checked before anything is made
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, text.encode(), mode=0o600)

    def create_metadata(self, vol_uuid: str, secret: str) -> None:
        """DRBD's internal metadata on a fresh backing device (the end of the device; sized by the caller)."""
        self._adm_cmd(vol_uuid, secret, "--", "--force", "create-md")

    def up(self, vol_uuid: str, secret: str, minor: int) -> None:
        """Attach and connect the resource; ``adjust`` when ``minor`` is configured already (a restart)."""
        self._adm_cmd(vol_uuid, secret, "adjust" if self.state(minor) is not None else "up")

    def skip_initial_sync(self, vol_uuid: str, secret: str) -> None:
        """For a brand-new pair only (both disks all zeroes, Connected, Secondary/Secondary, Inconsistent): both
        UpToDate without copying the whole device."""
        self._adm_cmd(vol_uuid, secret, "--", "--clear-bitmap", "new-current-uuid")

    def promote(self, vol_uuid: str, secret: str) -> None:
        """Primary, never forced: a replica that is not UpToDate is refused (``FailedPrecondition``)."""
        try:
            self._adm_cmd(vol_uuid, secret, "primary")
        except CommandError as exc:
            if any(marker in f"{exc.out}\n{exc.err}" for marker in _NOT_UP_TO_DATE):
                raise FailedPrecondition(
                    f"replica of volume {vol_uuid} cannot be primary: DRBD refused it ({exc.err.strip()[-200:]})"
                ) from exc
            raise

    def demote(self, vol_uuid: str, secret: str) -> None:
        self._adm_cmd(vol_uuid, secret, "secondary")

    def outdate(self, vol_uuid: str, secret: str, cut: bool = False) -> None:
        """Mark this replica's data Outdated (the controller's decision when its peer went on without it).

        ``cut``: this side still believes it is connected (DRBD refuses to outdate a connected disk) while its
        peer has already lost it and asked to fence it. The connection is dropped hard (no cluster-wide state
        change, which would wait for a peer that no longer hears), the disk outdated, and the resource set to
        connect again, so it comes back as a resync target when the link heals."""
        if cut:
            self._adm_cmd(vol_uuid, secret, "--", "--force", "disconnect")
        self._adm_cmd(vol_uuid, secret, "outdate")
        if cut:
            self._adm_cmd(vol_uuid, secret, "connect")

    def discard_mine(self, vol_uuid: str, secret: str) -> None:
        """The split-brain loser, as the controller directed: a ``StandAlone`` resource connects again discarding
        this replica's changes (DRBD 8.4 has no connection left to ``disconnect`` then: it exits 10)."""
        self._adm_cmd(vol_uuid, secret, "--", "--discard-my-data", "connect")

    def resize(self, vol_uuid: str, secret: str, minor: int, size: int) -> None:
        """Grow the replicated device to its backing devices' new size (both grown, Connected), and wait until
        it is ``size`` bytes (see the module's contract)."""
        self._adm_cmd(vol_uuid, secret, "resize")
        deadline = time.monotonic() + self._grow_wait
        while (now := self._device_bytes(minor)) < size:
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"volume {vol_uuid}: DRBD's device is {now} bytes, not yet {size} (its peer has not answered "
                    "with its grown size); retry"
                )
            time.sleep(0.2)

    def down(self, vol_uuid: str, secret: str, minor: int) -> None:
        """Stop the resource (when configured) and remove its file."""
        if self.state(minor) is not None:
            self._adm_cmd(vol_uuid, secret, "down")
        self.path(vol_uuid).unlink(missing_ok=True)

    def state(self, minor: int) -> DrbdState | None:
        """The kernel's state of ``minor``; ``None`` when not configured (or DRBD is not loaded)."""
        try:
            return parse_proc_drbd(self._read_proc()).get(minor)
        except FileNotFoundError:
            return None

    def _adm_cmd(self, vol_uuid: str, secret: str, *words: str) -> None:
        argv: Sequence[str] = [self._adm, "-c", str(self.path(vol_uuid)), *words, resource_name(vol_uuid)]
        try:
            self._run(argv, timeout=self._timeout, secrets=(secret,))
        except CommandError as exc:
            out, err = exc.out, exc.err
            if secret:
                out, err = out.replace(secret, "***"), err.replace(secret, "***")
            raise CommandError(exc.argv, exc.rc, out, err) from None


def _sysfs_bytes(minor: int) -> int:
    return int(Path(f"/sys/block/drbd{minor}/size").read_text()) * 512
