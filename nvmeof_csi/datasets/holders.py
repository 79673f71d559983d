"""Which target agents hold volumes of a data set, recorded in Alluxio itself: the one store every agent sees.
A data set is unpinned and freed only when no volume on any agent uses it.

Layout: ``/.nvmeof-csi/holders/<sha256(dataset path)[:16]>/<agent name>`` (empty folders, outside every
data-set root so no hydration ever copies them).

Contract: :meth:`DatasetHolders.hold` records this agent before it fills a volume of the data set (idempotent);
:meth:`DatasetHolders.drop` removes this agent's record once it has no volume of the data set left and returns
the other agents that still hold it (empty: the caller may release it). A missing record is not an error.
A race remains between another agent's ``hold`` and this agent's release: that agent's fill then loads the
data set again (its load jobs and pin come after the release), so nothing is lost but cache warmth.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging

from nvmeof_csi.datasets.client import AlluxioRest, CacheNotFound
from nvmeof_csi.nvmeof.dataset import DatasetSpec

log = logging.getLogger(__name__)
HOLDERS_ROOT = "/.nvmeof-csi/holders"


class DatasetHolders:
    def __init__(self, rest: AlluxioRest, agent: str) -> None:
        self._rest = rest
        self._agent = agent

    @staticmethod
    def folder(spec: DatasetSpec) -> str:
        return f"{HOLDERS_ROOT}/{hashlib.sha256(spec.path.encode()).hexdigest()[:16]}"

    def hold(self, spec: DatasetSpec) -> None:
        self._rest.create_directory(f"{self.folder(spec)}/{self._agent}")

    def drop(self, spec: DatasetSpec) -> list[str]:
        folder = self.folder(spec)
        with contextlib.suppress(CacheNotFound):
            self._rest.delete(f"{folder}/{self._agent}")
        try:
            others = sorted(s.path.rstrip("/").rsplit("/", 1)[-1] for s in self._rest.list_status(folder))
        except CacheNotFound:
            return []
        if not others:
            with contextlib.suppress(CacheNotFound):
                self._rest.delete(folder, recursive=True)
        return others
