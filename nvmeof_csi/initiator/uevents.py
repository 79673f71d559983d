"""Waiting for block devices to appear: kernel uevents through pyudev, with polling as the fallback.

Contract: ``open_block_events()`` returns a context manager; inside it, ``wait(timeout)`` returns as soon as a
block-device uevent arrives (or after ``timeout`` seconds) -- it never says *which* device, callers re-read
sysfs (the source of truth) after each wake-up. The monitor listens to the kernel's own netlink uevents, so it
works without udevd. When netlink or libudev is not available the waiter degrades to a short sleep, so a
missed event can only delay discovery by at most one poll interval, never lose it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import pyudev

log = logging.getLogger(__name__)
POLL_INTERVAL = 0.25


class EventWait(Protocol):
    source: str

    def wait(self, timeout: float) -> None: ...


class PollingWait:
    source = "polling"

    def __init__(self, sleep: Callable[[float], None] = time.sleep, interval: float = POLL_INTERVAL) -> None:
        self._sleep, self._interval = sleep, interval

    def wait(self, timeout: float) -> None:
        self._sleep(max(0.0, min(timeout, self._interval)))


class UdevWait:
    """Wakes on any kernel uevent of the ``block`` subsystem."""

    source = "udev"

    def __init__(self, monitor: object) -> None:
        self._monitor = monitor

    def wait(self, timeout: float) -> None:
        poll = getattr(self._monitor, "poll")  # noqa: B009 (pyudev ships no type hints)
        if poll(max(0.0, timeout)) is not None:
            while poll(0) is not None:  # drain a burst (head device + paths arrive together)
                pass


@contextmanager
def open_block_events() -> Iterator[EventWait]:
    """A uevent waiter for block devices (pyudev), or a polling one when that cannot be had."""
    try:
        monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
        monitor.filter_by("block")
        monitor.start()
    except (ImportError, OSError, ValueError) as exc:  # no libudev, or netlink refused
        log.info("block uevents unavailable (%s); discovering devices by polling sysfs", exc)
        yield PollingWait()
        return
    yield UdevWait(monitor)  # the netlink socket closes when the monitor is released (pyudev has no stop)
