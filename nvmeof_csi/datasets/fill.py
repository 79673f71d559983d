"""The target agent's filler for dataset volumes (it implements ``nvmeof_csi.agent.filler.Filler``): hydrate a
volume's backing file from Alluxio, show progress, keep the data set pinned while volumes reference it, and
release it after the last one.

Contract: :meth:`DatasetVolumes.fill` first checks the data set may be read at all (``dataset.uri`` under an
under-store prefix the operator allowed, none by default; ``dataset.path`` under the agent's data-set root;
``PermissionDenied`` otherwise), then runs (or resumes) hydration of one volume and returns the labels to
record with it (``dataset.*``: files, bytes, cache vs. under-store bytes, hit ratio, worker hosts); while it
runs, :meth:`progress` returns a one-line progress text for that volume. At most ``max_fills`` volumes hydrate
at once (each copies ``FETCH_WORKERS`` files at a time): the agent holds a :meth:`slot` around each fill, and a
slot asked for without ``wait`` (an RPC thread) is ``ResourceExhausted`` at once when none is free, naming the
fills that run. Work folders live under
``work_root/<volume uuid>`` and are removed by :meth:`discard`. :meth:`release` unpins and frees a
data set when no other volume references its Alluxio path, on this agent or on any other (``holders``:
``cache/holders.py``); a cache that cannot be reached then is logged, never raised (deleting a volume must
not fail because the cache is down; the TTL, if any, frees it later).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

from nvmeof_csi.datasets.holders import DatasetHolders
from nvmeof_csi.datasets.hydrate import Hydrator, Progress
from nvmeof_csi.errors import DriverError, PermissionDenied, SlotsBusy
from nvmeof_csi.host.paths import child
from nvmeof_csi.nvmeof.dataset import DatasetSpec
from nvmeof_csi.nvmeof.nqn import check_uuid

log = logging.getLogger(__name__)


def ufs_allowed(uri: str, prefixes: Sequence[str]) -> bool:
    """True when ``uri`` is one of ``prefixes`` or below one of them (whole path segments; no ``..``), also once
    every percent-encoding is decoded (an under-store decodes ``%2e%2e`` to ``..`` after this check)."""
    forms = [uri]
    while len(forms) < 4 and unquote(forms[-1]) != forms[-1]:
        forms.append(unquote(forms[-1]))
    if len(forms) == 4 or any(".." in f.replace("\\", "/").split("/") or "\x00" in f for f in forms):
        return False
    return all(
        any(f == p.rstrip("/") or f.startswith(p.rstrip("/") + "/") for p in prefixes if p.strip("/")) for f in forms
    )


#: volumes hydrating at once on one agent (the agent serves many more calls at once: ``rpc.server``)
MAX_FILLS = 4


class DatasetVolumes:
    def __init__(
        self,
        hydrator: Hydrator,
        work_root: Path,
        allowed_ufs: Sequence[str] = (),
        root: str = "/datasets",
        holders: DatasetHolders | None = None,
        max_fills: int = MAX_FILLS,
    ) -> None:
        self.hydrator = hydrator
        self.holders = holders
        self.work_root = work_root
        self.allowed_ufs = tuple(allowed_ufs)
        self.root = root
        self._progress: dict[str, str] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_fills)
        self._max_fills = max_fills

    def progress(self, vol_uuid: str) -> str:
        with self._lock:
            return self._progress.get(vol_uuid, "")

    def _report(self, vol_uuid: str, spec: DatasetSpec, step: Progress) -> None:
        line = step.line()
        with self._lock:
            self._progress[vol_uuid] = line
        log.info("volume %s: hydrating %s: %s", vol_uuid, spec.path, line)

    def _check_source(self, spec: DatasetSpec) -> None:
        """The agent is no confused deputy: it reads only under-stores its operator allowed, into Alluxio paths
        under its data-set root."""
        if spec.path != self.root and not spec.path.startswith(self.root.rstrip("/") + "/"):
            raise PermissionDenied(f"dataset.path {spec.path!r} is not under this agent's data-set root {self.root!r}")
        if spec.uri and not ufs_allowed(spec.uri, self.allowed_ufs):
            allowed = ", ".join(self.allowed_ufs) or "none (agent --dataset-ufs-allow)"
            raise PermissionDenied(
                f"dataset.uri {spec.uri!r} is not under an under-store this agent may read (allowed: {allowed})"
            )

    def fill(self, vol_uuid: str, spec: DatasetSpec, backing: Path, capacity: int) -> dict[str, str]:
        self._check_source(spec)
        if self.holders is not None:
            self.holders.hold(spec)  # before the fill: another agent's release must see this agent
        work = child(self.work_root, check_uuid(vol_uuid, "volume UUID"), "volume UUID")
        work.mkdir(parents=True, exist_ok=True)
        try:
            report = lambda step: self._report(vol_uuid, spec, step)  # noqa: E731 (one line, named for its role)
            result = self.hydrator.hydrate(spec, backing, capacity, work, report)
        finally:
            with self._lock:
                self._progress.pop(vol_uuid, None)
        return {
            "dataset.files": str(result.files),
            "dataset.bytes": str(result.bytes),
            "dataset.cacheBytes": str(result.cache_bytes),
            "dataset.ufsBytes": str(result.ufs_bytes),
            "dataset.hitRatio": f"{result.hit_ratio:.4f}",
            "dataset.workers": ",".join(result.workers),
        }

    @contextmanager
    def slot(self, wait: bool) -> Iterator[None]:
        if not self._slots.acquire(blocking=wait):
            raise SlotsBusy(f"all {self._max_fills} fill slots of this agent are taken by running fills: retry later")
        try:
            yield
        finally:
            self._slots.release()

    def discard(self, vol_uuid: str) -> None:
        shutil.rmtree(child(self.work_root, check_uuid(vol_uuid, "volume UUID"), "volume UUID"), ignore_errors=True)

    def release(self, spec: DatasetSpec, others: Iterable[DatasetSpec]) -> None:
        if any(other.path == spec.path for other in others):
            return
        try:
            holding = self.holders.drop(spec) if self.holders is not None else []
            if holding:
                log.info("data set %s is still used by agent(s) %s; kept pinned", spec.path, ", ".join(holding))
                return
            self.hydrator.release(spec)
        except DriverError as err:
            log.warning("data set %s could not be released (%s); its TTL, if any, frees it", spec.path, err)
