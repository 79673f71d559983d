"""What the host gets back from the lab VM's guest agent: a command's :class:`Result`, the :class:`Pending`
handle of a command still running, and the lab's errors (:class:`LabError` and its kinds for the VM itself,
:class:`GuestError` / :class:`GuestTimeout` for a command). :mod:`lab.vm` re-exports every name.

Contract: :meth:`Pending.wait` waits at most the command's own timeout plus :data:`MARGIN` seconds, then
raises :class:`GuestTimeout`; :meth:`Pending.check` raises :class:`GuestError` on a non-zero exit.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: seconds the host waits for an answer beyond the command's own timeout
MARGIN = 30.0


class LabError(RuntimeError):
    """The VM could not be started or the agent connection broke."""


class VMExited(LabError):
    """QEMU is gone while we still talk to the guest: the guest kernel panicked (``panic=-1`` with
    ``-no-reboot`` ends QEMU) or the process was killed. The message carries the console's tail."""


class BootCrash(VMExited):
    """QEMU exited before the guest agent was ready: the guest kernel crashed (or panicked) while booting."""


class BootHang(LabError):
    """QEMU still runs but the guest agent was not ready within the boot timeout, the console silent: a guest that
    hung while booting (seen once under TCG, in a run whose other boots all took well under a minute)."""


class GuestError(RuntimeError):
    """A guest command failed (non-zero exit)."""

    def __init__(self, what: str, result: Result) -> None:
        self.result = result
        err = result.err[-6000:] if result.rc < 0 else result.err[-2000:]  # rc < 0: the host's report, console too
        super().__init__(f"{what} -> rc={result.rc}\n{result.out[-2000:]}{err}")


class GuestTimeout(GuestError):
    """No answer from the guest within the command's timeout plus a margin."""


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str
    seconds: float


@dataclass
class Pending:
    """A command running in the guest; :meth:`wait` returns its :class:`Result`. ``context`` says what the
    VM showed (its console's tail) when no answer came, so that a hung guest is diagnosable from the report."""

    what: str
    timeout: float
    context: Callable[[], str] = lambda: ""
    _box: queue.Queue[dict[str, Any]] = field(default_factory=lambda: queue.Queue(1))

    def wait(self, timeout: float | None = None) -> Result:
        """The command's result; waits at most ``timeout`` (default: the command's own timeout + a margin)."""
        try:
            msg = self._box.get(timeout=self.timeout + MARGIN if timeout is None else timeout)
        except queue.Empty as exc:
            why = f"no reply from the guest\n{self.context()}"
            raise GuestTimeout(self.what, Result(-9, "", why, self.timeout)) from exc
        return Result(int(msg.get("rc", -1)), msg.get("out", ""), msg.get("err", ""), float(msg.get("t", 0.0)))

    def done(self) -> bool:
        """True once the command has finished (its result is waiting)."""
        return not self._box.empty()

    def check(self) -> str:
        res = self.wait()
        if res.rc != 0:
            raise GuestError(self.what, res)
        return res.out
