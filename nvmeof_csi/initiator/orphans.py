"""Releasing what the driver connected and nothing claims any more (a volume unstaged while the node plugin was
down, a staging record lost or set aside), the way os-brick treats a failed disconnect: one subsystem at a time.

Contract: :meth:`OrphanReleaser.release` disconnects every controller of each driver subsystem (whole-NQN
match, ``nvmeof/nqn.py``) that is not in ``claimed``, except one whose device is mounted, held or open (kept and
reported). A failed disconnect never raises: it is logged, counted and remembered, the other subsystems are still
released, and a later ``release(..., only=unreleased)`` tries the remembered ones again. Subsystems of anyone
else are never touched. Not thread-safe: the node's start and its periodic pass call it one at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set

from nvmeof_csi.errors import DriverError
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.nvmeof.nqn import is_driver_nqn
from nvmeof_csi.service.contracts import OrphanStats

log = logging.getLogger(__name__)


class OrphanReleaser:
    def __init__(self, executor: Executor, sysfs: NvmeSysfs, in_use: Callable[[str], str], timeout: float) -> None:
        self._exec = executor
        self._sysfs = sysfs
        self._in_use = in_use
        self._timeout = timeout
        self._unreleased: set[str] = set()  # orphans whose disconnect failed, to be tried again
        self._failures = 0

    @property
    def unreleased(self) -> frozenset[str]:
        return frozenset(self._unreleased)

    def stats(self) -> OrphanStats:
        return OrphanStats(len(self._unreleased), self._failures)

    def release(self, claimed: Set[str], only: Set[str] | None = None) -> list[str]:
        """Release the driver's subsystems not in ``claimed`` (``only``: just these NQNs); returns the actions."""
        actions = []
        present = set()
        for sub in self._sysfs.subsystems():
            present.add(sub.nqn)
            if not is_driver_nqn(sub.nqn) or sub.nqn in claimed or (only is not None and sub.nqn not in only):
                continue
            busy = [f"{ns.device} {why}" for ns in sub.namespaces if (why := self._in_use(ns.device))]
            if busy:  # never pull a device from under a mount or a user, whatever the records say
                log.warning("subsystem %s: no staging record claims it, but %s; kept", sub.nqn, "; ".join(busy))
                actions.append(f"kept {sub.nqn}: no staged volume claims it, but {'; '.join(busy)}")
                self._unreleased.discard(sub.nqn)
                continue
            try:
                for ctrl in sub.controllers:
                    self._exec.run(["nvme", "disconnect", "-d", ctrl.name], timeout=self._timeout)
            except DriverError as err:
                self._unreleased.add(sub.nqn)
                self._failures += 1
                log.warning(
                    "subsystem %s: nothing claims it; its disconnect failed, tried again later: %s", sub.nqn, err
                )
                actions.append(f"could not disconnect {sub.nqn} (retried later): {err}")
                continue
            self._unreleased.discard(sub.nqn)
            actions.append(f"disconnected {sub.nqn}: no staged volume claims it")
        if only is not None:  # gone meanwhile, or claimed again: nothing left to try for them
            self._unreleased -= {n for n in only if n not in present or n in claimed}
        return actions
