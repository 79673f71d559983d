"""The threads a process runs beside its gRPC server (the controller's name census and identity signer, a node's
or an agent's own certificate kept issued, an agent's resumed fills): the wiring *builds* them, the server's
``serve`` starts and stops them, in one place.

Contract: :meth:`Background.add` only records a loop (nothing runs). :meth:`Background.start` starts every loop
in the order added, each in a thread of its name, with one shared stop event; starting twice is an error.
:meth:`Background.stop` sets the event and joins the threads in reverse order, each for at most what is left of
``timeout``; it returns the names of the threads still running (logged: a loop that does not watch its event, or
one in a long call), and is harmless to repeat or to call before :meth:`start`. A loop must return soon after
the event is set; an exception that ends a loop is logged with its traceback, never raised into the server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nvmeof_csi.errors import DriverError

log = logging.getLogger(__name__)

Loop = Callable[[threading.Event], None]


@dataclass
class Background:
    loops: list[tuple[str, Loop]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def add(self, name: str, loop: Loop) -> None:
        """Run ``loop(stop_event)`` in a thread named ``name`` once the server starts."""
        self.loops.append((name, loop))

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("background loops were started already")
        for name, loop in self.loops:
            thread = threading.Thread(target=self._run, args=(name, loop), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
            log.debug("background %s started", name)

    def _run(self, name: str, loop: Loop) -> None:
        try:
            loop(self._stop)
        except Exception:
            log.exception("background %s ended with an error", name)

    def stop(self, timeout: float = 10.0) -> list[str]:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in reversed(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in self._threads if t.is_alive()]
        if left:
            log.warning("background threads still running at stop: %s", ", ".join(left))
        return left


def every(period: float, step: Callable[[], object], what: str) -> Loop:
    """A loop running ``step`` every ``period`` seconds until its stop event; a step that fails with a driver or
    OS error is logged and the next one tries again (anything else ends the loop, logged by :class:`Background`)."""

    def loop(stop: threading.Event) -> None:
        while not stop.wait(period):
            try:
                step()
            except (DriverError, OSError) as err:
                log.warning("%s: a pass failed (%s); the next tries again", what, err)

    return loop
