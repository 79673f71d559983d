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

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from nvmeof_csi.datasets.client import AlluxioRest, CacheNotFound, DatasetLoader, FileStatus
from nvmeof_csi.errors import FailedPrecondition, OutOfRange, ResourceExhausted
from nvmeof_csi.host.atomic import write_atomic
from nvmeof_csi.host.executor import Executor
from nvmeof_csi.host.paths import inside
from nvmeof_csi.service.datasets import DatasetSpec

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
        executor: Executor,
        metrics: DatasetMetrics,
        sleep: Callable[[float], None] = time.sleep,
        load_timeout: float = 900.0,
    ) -> None:
        self.rest, self.loader, self.executor, self.metrics = rest, loader, executor, metrics
        self._sleep = sleep
        self._load_timeout = load_timeout

    # -- public ------------------------------------------------------------------------------------------
    def hydrate(
        self, spec: DatasetSpec, backing: Path, capacity: int, work: Path, progress: Callable[[Progress], None]
    ) -> HydrationResult:
        done_marker = work / "complete.json"
        if done_marker.exists():
            return _result_from(json.loads(done_marker.read_text()))
        self._ensure_namespace(spec)
        files = self.rest.files(spec.path)
        total = sum(f.length for f in files)
        needed = int(total * (1 + FS_OVERHEAD)) + FS_MIN_EXTRA
        if needed > capacity:
            raise OutOfRange(
                f"data set {spec.path} holds {total} bytes in {len(files)} files; the volume needs "
                f"at least {needed} bytes, it has {capacity}"
            )
        journal = work / "journal.jsonl"
        done = _read_journal(journal)  # read once: the room check and the copies both go by it
        self._check_room(work, total - sum(_int(d["size"]) for d in done.values()))
        progress(Progress(0, len(files), 0, total, "warming the cache"))
        self._warm(spec, files)
        tree = work / "tree"
        tree.mkdir(parents=True, exist_ok=True)
        cache_bytes = sum(_int(d["cached"]) for d in done.values())
        ufs_bytes = sum(_int(d["size"]) - _int(d["cached"]) for d in done.values())
        bytes_done = sum(_int(d["size"]) for d in done.values())
        todo = []
        for status in files:
            rel = status.path[len(spec.path) :].lstrip("/")
            inside(tree, tree / rel, f"file of data set {spec.path}")  # a listed name cannot leave the tree
            if not (rel in done and (tree / rel).is_file() and (tree / rel).stat().st_size == status.length):
                todo.append((status, rel))
        last_report = last_sync = 0.0
        with journal.open("a") as log_fh:
            for status, rel, digest in self._copy_all(todo, tree):
                cached = status.length * status.in_alluxio_percentage // 100  # cached before this hydration
                entry = {"path": rel, "size": status.length, "cached": cached, "sha256": digest}
                log_fh.write(json.dumps(entry) + "\n")
                log_fh.flush()
                if time.monotonic() - last_sync > 1.0:  # the file is fsynced already; a lost entry is a re-copy
                    os.fsync(log_fh.fileno())
                    last_sync = time.monotonic()
                done[rel] = entry
                cache_bytes += cached
                ufs_bytes += status.length - cached
                bytes_done += status.length
                if time.monotonic() - last_report > 1.0:
                    progress(Progress(len(done), len(files), bytes_done, total, "copying"))
                    last_report = time.monotonic()
            os.fsync(log_fh.fileno())
        progress(Progress(len(files), len(files), total, total, "building the filesystem"))
        self.executor.run(
            [
                "mkfs.ext4",
                "-F",
                "-q",
                "-d",
                str(tree),
                "-L",
                "dataset",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
                str(backing),
            ],
            timeout=MKFS_TIMEOUT,
        )
        self._set_cache_policy(spec)
        workers = {loc.host for f in self.rest.files(spec.path) for loc in f.locations}  # where it is cached now
        result = HydrationResult(len(files), total, cache_bytes, ufs_bytes, tuple(sorted(workers)))
        write_atomic(done_marker, json.dumps(result.to_json()).encode())
        shutil.rmtree(tree, ignore_errors=True)
        self.metrics.record(spec, result)
        progress(Progress(len(files), len(files), total, total, "done"))
        log.info(
            "data set %s hydrated: %d files, %d bytes, %.1f%% from cache",
            spec.path,
            result.files,
            result.bytes,
            100 * result.hit_ratio,
        )
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
    @staticmethod
    def _check_room(work: Path, still_to_copy: int) -> None:
        """The staging copy lives in the pool next to the volumes: refuse before filling the pool up."""
        work.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(work).free
        if still_to_copy > free - POOL_RESERVE:
            raise ResourceExhausted(
                f"the staging copy needs {still_to_copy} bytes; the pool has {free} free "
                f"(keeping {POOL_RESERVE} in reserve)"
            )

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

    def _copy_all(self, todo: list[tuple[FileStatus, str]], tree: Path) -> Iterator[tuple[FileStatus, str, str]]:
        """Copy every file of ``todo`` into ``tree``, ``FETCH_WORKERS`` at a time; yields (status, rel, sha256) as
        each completes (fsynced). After the first failure no new copy starts; the copies still running are
        finished and yielded (so the journal keeps them), then the first error is raised."""
        pool = ThreadPoolExecutor(FETCH_WORKERS, thread_name_prefix="hydrate")
        running: dict[Future[str], tuple[FileStatus, str]] = {}
        queue = iter(todo)
        failure: BaseException | None = None
        try:
            while True:
                for status, rel in queue if failure is None else ():
                    running[pool.submit(self._fetch, status.path, tree / rel, status.length)] = (status, rel)
                    if len(running) >= 2 * FETCH_WORKERS:
                        break
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    status, rel = running.pop(future)
                    error = future.exception()
                    if error is None:
                        yield status, rel, future.result()
                    elif failure is None:
                        failure = error
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if failure is not None:
            raise failure

    def _fetch(self, path: str, dest: Path, length: int) -> str:
        """One file of the data set into ``dest`` (through ``dest.part``, fsynced); returns its sha256. At most
        its listed ``length`` is written: a stream that runs past it (a file that grew, or a hostile cache) is
        refused before it can fill the agent's disk."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        sha, written = hashlib.sha256(), 0
        with tmp.open("wb") as fh:
            for chunk in self.rest.read(path):
                written += len(chunk)
                if written > length:
                    tmp.unlink(missing_ok=True)
                    raise FailedPrecondition(f"data set file {path} streamed more than its listed {length} bytes")
                fh.write(chunk)
                sha.update(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        return sha.hexdigest()

    def _set_cache_policy(self, spec: DatasetSpec) -> None:
        if spec.pin:
            self.rest.set_attribute(spec.path, pinned=True, pinned_media=[spec.medium] if spec.medium else None)
        if spec.ttl_seconds:
            self.rest.set_attribute(spec.path, ttl_ms=spec.ttl_seconds * 1000, ttl_action="FREE")


def _int(value: object) -> int:
    return int(str(value))


def _read_journal(path: Path) -> dict[str, dict[str, object]]:
    done: dict[str, dict[str, object]] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a torn last line is simply redone
            entry = json.loads(line)
            done[str(entry["path"])] = entry
    return done


def _result_from(doc: dict[str, object]) -> HydrationResult:
    workers = doc.get("workers")
    workers = workers if isinstance(workers, list) else []
    files, size, cached, ufs = (_int(doc[k]) for k in ("files", "bytes", "cache_bytes", "ufs_bytes"))
    return HydrationResult(files, size, cached, ufs, tuple(str(w) for w in workers))
