"""Every lock kind, in one module.

- :class:`KeyedLocks`: non-blocking try-locks for the RPC edge. :meth:`KeyedLocks.hold` takes every key or
  none (no waiting): a key held by another RPC raises ``Aborted`` (gRPC ABORTED), which tells the caller to
  retry later. Each service declares its own table of which request fields are locked (``LockTable``).
- :class:`KeyedMutex`: blocking keyed mutexes for work inside a service (the agent's per-volume and per-name
  locks). :meth:`KeyedMutex.hold` waits until it owns every key, taken in sorted order so two holders never
  deadlock; with ``wait`` it waits that many seconds at most for each key, then lets go of what it took and
  raises ``Aborted`` (a caller retries later rather than holding a thread for as long as the holder works).

Both remove an entry when its last holder leaves, so memory never grows with the number of keys ever seen.
Thread-safe and usable from asyncio tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager

from nvmeof_csi.errors import Aborted

#: RPC full method name -> request fields whose values are locked for the call's duration.
LockTable = Mapping[str, tuple[str, ...]]


class KeyedLocks:
    """A set of held keys; ``hold`` fails fast instead of waiting."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held: set[str] = set()

    def take(self, *keys: str) -> Callable[[], None]:
        """Take every key now or raise ``Aborted``; returns the function that releases them (call it once)."""
        wanted = sorted({k for k in keys if k})
        with self._mutex:
            busy = [k for k in wanted if k in self._held]
            if busy:
                raise Aborted(f"an operation on {busy[0]!r} is already in progress")
            self._held.update(wanted)

        def release() -> None:
            with self._mutex:
                self._held.difference_update(wanted)

        return release

    @contextmanager
    def hold(self, *keys: str) -> Iterator[None]:
        release = self.take(*keys)
        try:
            yield
        finally:
            release()

    def held(self) -> frozenset[str]:
        with self._mutex:
            return frozenset(self._held)


class KeyedMutex:
    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    def _acquire_entry(self, key: str) -> threading.Lock:
        with self._mutex:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        return lock

    def _release_entry(self, key: str) -> None:
        with self._mutex:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    @contextmanager
    def _one(self, key: str, wait: float | None) -> Iterator[None]:
        lock = self._acquire_entry(key)
        try:
            if not lock.acquire(timeout=-1 if wait is None else wait):
                raise Aborted(f"an operation on {key!r} is still in progress after {wait:g} s; retry later")
            try:
                yield
            finally:
                lock.release()
        finally:
            self._release_entry(key)

    @contextmanager
    def hold(self, *keys: str, wait: float | None = None) -> Iterator[None]:
        with ExitStack() as stack:
            for key in sorted(set(keys)):
                stack.enter_context(self._one(key, wait))
            yield

    def size(self) -> int:
        with self._mutex:
            return len(self._locks)
