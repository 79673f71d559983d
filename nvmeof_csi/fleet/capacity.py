"""The free capacity of every agent as placement sees it: asked of the agents at most once per freshness window,
not on every CreateVolume, so that a create costs the same with 1 agent or 64.

Contract (bounded staleness):
- a free-bytes figure placement uses was read from its agent at most ``fresh_for`` seconds (default
  :data:`FRESH_FOR`) plus one read's time ago, less what this controller has placed on that agent since
  (:meth:`CapacityCache.spent`): a stale figure is read again in the background (at most :data:`WORKERS` agents
  at once) and used until the answer comes, so no create waits for a refresh; an agent never read is read at
  once (several in parallel: one placement waits for the slowest, not for their sum);
- a figure that may be too high (the agent refused a create for space, or a volume was deleted there) is dropped
  with :meth:`CapacityCache.forget` and read again by the next placement;
- an agent that did not answer (``Unavailable``) is left out of placement, logged once when it goes away, and
  asked again in the background every ``down_for`` seconds (default :data:`DOWN_FOR`): a dead agent costs its
  probe once per window, never a create's wait.
Thread-safe; never raises for an unreachable agent (other errors of an agent are raised to the caller).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from nvmeof_csi.errors import Unavailable
from nvmeof_csi.topology.fabric_map import AgentEntry
from nvmeof_csi.topology.placement import Candidate

log = logging.getLogger(__name__)

FRESH_FOR = 10.0
DOWN_FOR = 30.0
WORKERS = 8


@dataclass(frozen=True)
class Seen:
    """What an agent said last: its free bytes (``None``: it did not answer) and when (the cache's clock)."""

    free: int | None
    at: float


class CapacityCache:
    def __init__(
        self,
        ask: Callable[[AgentEntry], int],
        clock: Callable[[], float],
        fresh_for: float = FRESH_FOR,
        down_for: float = DOWN_FOR,
    ) -> None:
        """``ask`` returns an agent's free bytes (raising ``Unavailable`` when it cannot be reached)."""
        self._ask = ask
        self._clock = clock
        self._fresh_for = fresh_for
        self._down_for = down_for
        self._seen: dict[str, Seen] = {}
        self._probing: set[str] = set()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def candidates(self, entries: Sequence[AgentEntry]) -> list[Candidate]:
        """The agents of ``entries`` that answer, each with its free bytes (see the module's contract)."""
        now = self._clock()
        with self._lock:
            seen = dict(self._seen)
        for entry in entries:  # stale: read again in the background, the last figure used meanwhile
            if entry.name in seen and self._stale(seen[entry.name], now):
                self._probe_later(entry)
        never = [e for e in entries if e.name not in seen]  # never read: read now, in parallel
        if len(never) > 1:
            for entry, future in [(e, self._executor().submit(self._read, e)) for e in never]:
                seen[entry.name] = future.result()
        elif never:
            seen[never[0].name] = self._read(never[0])
        return [Candidate(e, free) for e in entries if (free := seen[e.name].free) is not None]

    def spent(self, agent: str, nbytes: int) -> None:
        """``nbytes`` were placed on ``agent``: count them against its cached free bytes until it is read again."""
        with self._lock:
            seen = self._seen.get(agent)
            if seen is not None and seen.free is not None:
                self._seen[agent] = Seen(max(0, seen.free - nbytes), seen.at)

    def forget(self, agent: str) -> None:
        """Read ``agent``'s free bytes again at the next placement (they may have changed more than counted)."""
        with self._lock:
            seen = self._seen.get(agent)
            if seen is not None and seen.free is not None:
                del self._seen[agent]

    def forget_all(self) -> None:
        """Read every answering agent again at the next placement (before a placement says nothing fits)."""
        with self._lock:
            self._seen = {name: seen for name, seen in self._seen.items() if seen.free is None}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _stale(self, seen: Seen, now: float) -> bool:
        return now - seen.at >= (self._fresh_for if seen.free is not None else self._down_for)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="capacity")
            return self._pool

    def _read(self, entry: AgentEntry) -> Seen:
        """Ask ``entry`` now and keep the answer."""
        try:
            seen = Seen(self._ask(entry), self._clock())
        except Unavailable as err:
            seen = Seen(None, self._clock())
            with self._lock:
                was_up = self._seen.get(entry.name, Seen(0, 0.0)).free is not None
            if was_up:
                log.warning(
                    "agent %s left out of placement (asked again every %.0f s): %s", entry.name, self._down_for, err
                )
        with self._lock:
            self._seen[entry.name] = seen
        if seen.free is not None and entry.name in self._probing:
            log.info("agent %s answers again: back in placement", entry.name)
        return seen

    def _probe_later(self, entry: AgentEntry) -> None:
        with self._lock:
            if entry.name in self._probing:
                return
            self._probing.add(entry.name)

        def done(future: Future[Seen]) -> None:
            with self._lock:
                self._probing.discard(entry.name)
                if future.exception() is not None:  # an answer, but an error: still out, asked again later
                    self._seen[entry.name] = Seen(None, self._clock())

        self._executor().submit(self._read, entry).add_done_callback(done)
