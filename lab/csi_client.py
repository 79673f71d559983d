"""Host side of a lab VM's resident clients (:mod:`lab.csi_serve`): CSI batches and agent calls.

Contract: :meth:`Resident.call` sends one request to the VM's resident server of its kind and returns its
results, or raises :class:`lab.vm.GuestError` whose message carries what the server said of a failed call (the
gRPC code of a failed RPC, the type and message of an agent's refusal), as a process per call did. The server is
started on first use and again whenever it is gone (the VM rebooted, or it was killed); a request is sent again
only when it never reached a server.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lab.build import REPO
from lab.guest_calls import GuestError, LabError, Pending, Result
from lab.vm import LabVM

#: outside the lab work folder, which clean-ups remove whole
CLIENT_SOCK = "/run/lab-csi-client.sock"
AGENT_OPS_SOCK = "/run/lab-agent-ops.sock"


class Resident:
    """The resident server of ``kind`` (``csi`` or ``agent``) for ``target`` (the socket it calls) in ``vm``."""

    def __init__(self, vm: LabVM, kind: str, target: str, path: str) -> None:
        self.vm, self.kind, self.target, self.path = vm, kind, target, path
        self._server: Pending | None = None

    def _start(self, timeout: float = 120) -> None:
        self.vm.run(["rm", "-f", self.path], 30)
        argv = [self.vm.python, "-m", "lab.csi_serve", self.kind, self.target, self.path]
        self._server = self.vm.submit(argv, timeout=7 * 24 * 3600, cwd=str(REPO))
        deadline = time.monotonic() + timeout
        while not self.vm.exists(self.path):
            if self._server.done() or time.monotonic() > deadline:
                res = self._server.wait(5) if self._server.done() else Result(-1, "", "no socket in time", timeout)
                raise LabError(
                    f"the resident {self.kind} client did not start: rc={res.rc} {res.out[-500:]}{res.err[-1500:]}"
                )
            time.sleep(0.3)

    def call(self, request: Any, what: str, timeout: float) -> Any:
        for attempt in (1, 2):
            if self._server is None or self._server.done():
                self._start()
            argv = ["socat", "-t", str(int(timeout)), "STDIO", f"UNIX-CONNECT:{self.path}"]
            res = self.vm.submit(argv, timeout + 30, stdin=json.dumps(request)).wait()
            unreached = res.rc != 0 and ("Connection refused" in res.err or "No such file" in res.err)
            if unreached and attempt == 1:
                self._server = None  # gone (a reboot): the request never ran; start one and send it again
                continue
            lines = res.out.strip().splitlines()
            if res.rc != 0 or not lines:
                raise GuestError(what, res)
            reply: dict[str, Any] = json.loads(lines[-1])
            if "error" in reply:
                raise GuestError(what, Result(1, "", str(reply["error"]), res.seconds))
            return reply["results"]
        raise GuestError(what, Result(-1, "", "unreachable", 0.0))


class CsiClient:
    """:mod:`lab.csi_ops` batches against the driver socket ``driver_socket``."""

    def __init__(self, vm: LabVM, driver_socket: str) -> None:
        self.vm, self.driver_socket = vm, driver_socket
        self._resident = Resident(vm, "csi", driver_socket, CLIENT_SOCK)

    def batch(self, steps: list[dict[str, Any]], timeout: float = 900) -> list[dict[str, Any]]:
        what = f"csi {' '.join(str(s.get('op')) for s in steps)}"
        results: list[dict[str, Any]] = self._resident.call(steps, what, timeout)
        return results
