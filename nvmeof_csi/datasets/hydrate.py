"""Hydration: fill a volume's backing file with a data set read through Alluxio.

Steps, each resumable: (1) make sure the data set is in Alluxio's namespace (mount ``dataset.uri`` read-only
at ``dataset.path`` if needed); (2) list its files and check they fit; (3) warm the cache with load jobs for
files not fully cached yet; (4) stream every file (at most its listed length) through the REST proxy into a
staging tree next to the pool, fsync it and journal it (the journal fsynced at least once a second: a lost entry
only means a copy made again; a restart skips journaled files); (5) build ext4 holding the tree directly in the
backing file (``mkfs.ext4 -d``: no loop device, no mount); (6) pin the data set (and set its TTL) and write a
``complete`` marker; the staging tree is removed.

Contract: :meth:`Hydrator.hydrate` is idempotent (a complete work folder is a no-op) and reports progress
through the callback; Alluxio being unreachable raises :class:`CacheUnavailable` (UNAVAILABLE), a data set
larger than the volume raises :class:`OutOfRange`. :meth:`Hydrator.release` unpins and frees a data set no
volume references any more. Bytes read from the cache vs. the under-store are counted per data set
(``inAlluxioPercentage`` of each file as listed before this hydration warmed the cache) in :class:`DatasetMetrics`.
Step (4) copies ``FETCH_WORKERS`` files at a time; a file enters the journal only once complete and fsynced.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from nvmeof_csi.datasets.client import AlluxioRest, CacheNotFound, DatasetLoader, FileStatus
from nvmeof_csi.datasets.copier import Journal, copy_all
from nvmeof_csi.errors import OutOfRange, ResourceExhausted
from nvmeof_csi.host.atomic import write_atomic
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.paths import inside
from nvmeof_csi.nvmeof.dataset import DatasetSpec

log = logging.getLogger(__name__)
FS_OVERHEAD = 0.08  # ext4 metadata, journal and per-file slack, as a share of the data set
FS_MIN_EXTRA = 32 << 20
LOAD_BATCH = 200
MKFS_TIMEOUT = 1800.0
POOL_RESERVE = 256 << 20  # never let a staging copy take the pool's last bytes
FETCH_WORKERS = 8  # files copied at once (the proxy serves them concurrently; one at a time is round-trip bound)


@dataclass(frozen=True)
class Progress:
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    phase: str

    def line(self) -> str:
        mib = 1 << 20
        return (
            f"{self.phase}: {self.files_done}/{self.files_total} files, "
            f"{self.bytes_done // mib}/{self.bytes_total // mib} MiB"
        )


@dataclass(frozen=True)
class HydrationResult:
    files: int
    bytes: int
    cache_bytes: int
    ufs_bytes: int
    workers: tuple[str, ...]

    @property
    def hit_ratio(self) -> float:
        return self.cache_bytes / self.bytes if self.bytes else 1.0

    def to_json(self) -> dict[str, object]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "cache_bytes": self.cache_bytes,
            "ufs_bytes": self.ufs_bytes,
            "workers": list(self.workers),
        }


class DatasetMetrics:
    """Per data set: bytes hydrated from Alluxio's cache vs. from the under-store, and the hit ratio."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.bytes = Counter(
            "nvmeof_csi_dataset_bytes",
            "Bytes of data sets hydrated into volumes, by source",
            ["dataset", "source"],
            registry=registry,
        )
        self.hit_ratio = Gauge(
            "nvmeof_csi_dataset_cache_hit_ratio",
            "Share of a data set's hydrated bytes served from Alluxio's cache (last hydration)",
            ["dataset"],
            registry=registry,
        )
        self.volumes = Gauge(
            "nvmeof_csi_dataset_volumes", "Volumes referencing a data set", ["dataset"], registry=registry
        )

    def record(self, spec: DatasetSpec, result: HydrationResult) -> None:
        self.bytes.labels(spec.label, "cache").inc(result.cache_bytes)
        self.bytes.labels(spec.label, "ufs").inc(result.ufs_bytes)
        self.hit_ratio.labels(spec.label).set(result.hit_ratio)


class Hydrator:
    def __init__(
        self,
        rest: AlluxioRest,
        loader: DatasetLoader,
        filesystems: Filesystems,
        metrics: DatasetMetrics,
        sleep: Callable[[float], None] = time.sleep,
        load_timeout: float = 900.0,
        high_water: float = 100.0,
    ) -> None:
        """``high_water``: the pool's high-water mark (percent): staging copies never take the pool past it."""
        self.rest, self.loader, self.filesystems, self.metrics = rest, loader, filesystems, metrics
        self._sleep = sleep
        self._load_timeout = load_timeout
        self._high_water = high_water
        self._staging: dict[Path, int] = {}  # work folder -> the staging bytes its running fill reserved
        self._room = threading.Lock()

    # -- public ------------------------------------------------------------------------------------------
    def hydrate(
        self, spec: DatasetSpec, backing: Path, capacity: int, work: Path, progress: Callable[[Progress], None]
    ) -> HydrationResult:
        done_marker = work / "complete.json"
        if done_marker.exists():
            return _result_from(json.loads(done_marker.read_text()))
        self._ensure_namespace(spec)
        files = self.rest.files(spec.path)
        total = _fits(spec, files, capacity)
        journal = Journal(work / "journal.jsonl")  # read once: the room check and the copies both go by it
        with self._staging_room(work, total - journal.bytes_done()):
            progress(Progress(0, len(files), 0, total, "warming the cache"))
            self._warm(spec, files)
            tree = work / "tree"
            start = Progress(len(journal.done), len(files), 0, total, "copying")
            self._copy(spec, files, tree, journal, start, progress)
            progress(Progress(len(files), len(files), total, total, "building the filesystem"))
            self.filesystems.make_from_tree(backing, tree, "dataset", timeout=MKFS_TIMEOUT)
            result = self._finish(spec, files, journal)
            write_atomic(done_marker, json.dumps(result.to_json()).encode())
            shutil.rmtree(tree, ignore_errors=True)
        progress(Progress(len(files), len(files), total, total, "done"))
        return result

    def release(self, spec: DatasetSpec) -> None:
        """The last volume of ``spec`` is gone: unpin and free the data set in Alluxio."""
        try:
            self.rest.set_attribute(spec.path, pinned=False)
            self.rest.free(spec.path)
        except CacheNotFound:
            return
        log.info("data set %s unpinned and freed (no volume references it)", spec.path)

    # -- steps -------------------------------------------------------------------------------------------
    @contextmanager
    def _staging_room(self, work: Path, still_to_copy: int) -> Iterator[None]:
        """The staging copy lives in the pool next to the volumes: its bytes are reserved beside those of every
        other running fill, until its tree is gone. ``ResourceExhausted`` when the copies together would leave
        less than ``POOL_RESERVE`` free or take the pool past its high-water mark."""
        work.mkdir(parents=True, exist_ok=True)
        with self._room:
            others = sum(self._staging.values())
            usage = shutil.disk_usage(work)
            wanted = still_to_copy + others
            if wanted > usage.free - POOL_RESERVE:
                raise ResourceExhausted(
                    f"the staging copy needs {still_to_copy} bytes ({others} more reserved by running fills); the "
                    f"pool has {usage.free} free (keeping {POOL_RESERVE} in reserve)"
                )
            if (usage.used + wanted) * 100 >= self._high_water * usage.total:
                raise ResourceExhausted(
                    f"the staging copy needs {still_to_copy} bytes ({others} more reserved by running fills): the "
                    f"pool would pass its high-water mark ({self._high_water:g}%)"
                )
            self._staging[work] = still_to_copy
        try:
            yield
        finally:
            with self._room:
                self._staging.pop(work, None)

    def _ensure_namespace(self, spec: DatasetSpec) -> None:
        if self.rest.exists(spec.path):
            return
        if not spec.uri:
            raise CacheNotFound(f"data set {spec.path} is not in Alluxio and no 'dataset.uri' was given")
        parent = spec.path.rsplit("/", 1)[0]
        if parent and not self.rest.exists(parent):
            self.rest.create_directory(parent)
        self.rest.mount(spec.path, spec.uri, readonly=True)
        log.info("mounted %s at %s (read-only)", spec.uri, spec.path)

    def _warm(self, spec: DatasetSpec, files: list[FileStatus]) -> None:
        cold = [f.path for f in files if f.in_alluxio_percentage < 100]
        if not cold:
            return
        jobs = [self.loader.load(cold[i : i + LOAD_BATCH]) for i in range(0, len(cold), LOAD_BATCH)]
        deadline = time.monotonic() + self._load_timeout
        pending = set(jobs)
        while pending and time.monotonic() < deadline:
            for job in list(pending):
                status = self.loader.job_status(job)
                if status.finished:
                    pending.discard(job)
                    if status.status != "COMPLETED":
                        log.warning(
                            "load job %s for %s ended %s: %s (files are cached while copying)",
                            job,
                            spec.path,
                            status.status,
                            status.error[:200],
                        )
            if pending:
                self._sleep(0.5)
        for job in pending:
            log.warning(
                "load job %s for %s still running after %.0fs; copying anyway", job, spec.path, self._load_timeout
            )

    def _copy(
        self,
        spec: DatasetSpec,
        files: list[FileStatus],
        tree: Path,
        journal: Journal,
        start: Progress,
        progress: Callable[[Progress], None],
    ) -> None:
        """Step (4): every listed file not journaled yet (or whose copy is not whole) into ``tree``, journaled."""
        tree.mkdir(parents=True, exist_ok=True)
        todo = []
        for status in files:
            rel = status.path[len(spec.path) :].lstrip("/")
            inside(tree, tree / rel, f"file of data set {spec.path}")  # a listed name cannot leave the tree
            if not (rel in journal.done and (tree / rel).is_file() and (tree / rel).stat().st_size == status.length):
                todo.append((status, rel))
        bytes_done, last_report = journal.bytes_done(), 0.0
        with journal:
            for status, rel, digest in copy_all(self.rest, todo, tree):
                cached = status.length * status.in_alluxio_percentage // 100  # cached before this hydration
                journal.add({"path": rel, "size": status.length, "cached": cached, "sha256": digest})
                bytes_done += status.length
                if time.monotonic() - last_report > 1.0:
                    progress(replace(start, files_done=len(journal.done), bytes_done=bytes_done))
                    last_report = time.monotonic()

    def _finish(self, spec: DatasetSpec, files: list[FileStatus], journal: Journal) -> HydrationResult:
        """Step (6): the cache policy set, the result counted and logged."""
        self._set_cache_policy(spec)
        workers = {loc.host for f in self.rest.files(spec.path) for loc in f.locations}  # where it is cached now
        cache_bytes = sum(_int(d["cached"]) for d in journal.done.values())
        total = sum(f.length for f in files)
        result = HydrationResult(len(files), total, cache_bytes, total - cache_bytes, tuple(sorted(workers)))
        self.metrics.record(spec, result)
        log.info(
            "data set %s hydrated: %d files, %d bytes, %.1f%% from cache",
            spec.path,
            result.files,
            result.bytes,
            100 * result.hit_ratio,
        )
        return result

    def _set_cache_policy(self, spec: DatasetSpec) -> None:
        if spec.pin:
            self.rest.set_attribute(spec.path, pinned=True, pinned_media=[spec.medium] if spec.medium else None)
        if spec.ttl_seconds:
            self.rest.set_attribute(spec.path, ttl_ms=spec.ttl_seconds * 1000, ttl_action="FREE")


def _int(value: object) -> int:
    return int(str(value))


def _fits(spec: DatasetSpec, files: list[FileStatus], capacity: int) -> int:
    """Step (2): the data set's bytes, when ext4 holding them fits in ``capacity`` (``OutOfRange`` otherwise)."""
    total = sum(f.length for f in files)
    needed = int(total * (1 + FS_OVERHEAD)) + FS_MIN_EXTRA
    if needed > capacity:
        raise OutOfRange(
            f"data set {spec.path} holds {total} bytes in {len(files)} files; the volume needs "
            f"at least {needed} bytes, it has {capacity}"
        )
    return total


def _result_from(doc: dict[str, object]) -> HydrationResult:
    workers = doc.get("workers")
    workers = workers if isinstance(workers, list) else []
    files, size, cached, ufs = (_int(doc[k]) for k in ("files", "bytes", "cache_bytes", "ufs_bytes"))
    return HydrationResult(files, size, cached, ufs, tuple(str(w) for w in workers))
