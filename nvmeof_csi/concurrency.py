"""Blocking keyed mutexes (the agent's per-volume and per-name locks).

Contract: :meth:`KeyedMutex.hold` waits until it owns every key (taken in sorted order, so two holders
never deadlock); entries are removed when the last holder leaves, so memory does not grow with the number
of keys ever seen. (The CSI edge uses the non-blocking try-locks in ``csi/locks.py`` instead.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager


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
    def _one(self, key: str) -> Iterator[None]:
        lock = self._acquire_entry(key)
        try:
            with lock:
                yield
        finally:
            self._release_entry(key)

    @contextmanager
    def hold(self, *keys: str) -> Iterator[None]:
        with ExitStack() as stack:
            for key in sorted(set(keys)):
                stack.enter_context(self._one(key))
            yield

    def size(self) -> int:
        with self._mutex:
            return len(self._locks)
