"""Hydration's copy step: a data set's files streamed through the Alluxio proxy into a staging tree,
``FETCH_WORKERS`` at a time, and the journal of files copied whole.

Contract: :func:`copy_all` yields each file as its copy completes (written through ``.part``, fsynced, renamed;
never more than its listed length); after the first failure no new copy starts, the running ones finish and are
yielded, then the first error is raised. :class:`Journal` keeps one JSON line per whole file, fsynced at least
once a second and when closed (a lost entry only means a copy made again; a torn last line is redone).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import TracebackType
from typing import IO

from nvmeof_csi.datasets.client import AlluxioRest, FileStatus
from nvmeof_csi.errors import FailedPrecondition

FETCH_WORKERS = 8  # files copied at once (the proxy serves them concurrently; one at a time is round-trip bound)


class Journal:
    """The files of a data set copied whole into the staging tree (``done``: relative path -> entry)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done = read_journal(path)
        self._fh: IO[str] | None = None
        self._last_sync = 0.0

    def bytes_done(self) -> int:
        return sum(int(str(d["size"])) for d in self.done.values())

    def __enter__(self) -> Journal:
        self._fh = self.path.open("a")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def add(self, entry: dict[str, object]) -> None:
        """Journal one whole, fsynced file (open the journal with ``with`` first)."""
        if self._fh is None:
            raise RuntimeError("the journal is not open")
        self._fh.write(json.dumps(entry) + "\n")
        self._fh.flush()
        if time.monotonic() - self._last_sync > 1.0:  # the file is fsynced already; a lost entry is a re-copy
            os.fsync(self._fh.fileno())
            self._last_sync = time.monotonic()
        self.done[str(entry["path"])] = entry


def read_journal(path: Path) -> dict[str, dict[str, object]]:
    done: dict[str, dict[str, object]] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a torn last line is simply redone
            entry = json.loads(line)
            done[str(entry["path"])] = entry
    return done


def copy_all(
    rest: AlluxioRest, todo: list[tuple[FileStatus, str]], tree: Path
) -> Iterator[tuple[FileStatus, str, str]]:
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
                running[pool.submit(_fetch, rest, status.path, tree / rel, status.length)] = (status, rel)
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


def _fetch(rest: AlluxioRest, path: str, dest: Path, length: int) -> str:
    """One file of the data set into ``dest`` (through ``dest.part``, fsynced); returns its sha256. At most
    its listed ``length`` is written: a stream that runs past it (a file that grew, or a hostile cache) is
    refused before it can fill the agent's disk."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    sha, written = hashlib.sha256(), 0
    with tmp.open("wb") as fh:
        for chunk in rest.read(path):
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
