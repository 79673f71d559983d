"""Host side of the resident CSI client (:mod:`lab.csi_serve`) of one lab VM.

Contract: :meth:`CsiClient.batch` runs a batch of :mod:`lab.csi_ops` steps against the driver socket and returns
their results, or raises :class:`lab.vm.GuestError` whose message carries the gRPC code of a failed RPC (as the
one-process-per-batch ``lab.csi_ops`` did). The server is started on first use and again whenever it is gone
(the VM rebooted, or it was killed); a batch is retried only when it never reached a server.
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


class CsiClient:
    def __init__(self, vm: LabVM, driver_socket: str) -> None:
        self.vm, self.driver_socket = vm, driver_socket
        self._server: Pending | None = None

    def _start(self, timeout: float = 120) -> None:
        self.vm.run(["rm", "-f", CLIENT_SOCK], 30)
        argv = [self.vm.python, "-m", "lab.csi_serve", self.driver_socket, CLIENT_SOCK]
        self._server = self.vm.submit(argv, timeout=7 * 24 * 3600, cwd=str(REPO))
        deadline = time.monotonic() + timeout
        while not self.vm.exists(CLIENT_SOCK):
            if self._server.done() or time.monotonic() > deadline:
                res = self._server.wait(5) if self._server.done() else Result(-1, "", "no socket in time", timeout)
                raise LabError(f"the resident CSI client did not start: rc={res.rc} {res.out[-500:]}{res.err[-1500:]}")
            time.sleep(0.3)

    def batch(self, steps: list[dict[str, Any]], timeout: float = 900) -> list[dict[str, Any]]:
        what = f"csi {' '.join(str(s.get('op')) for s in steps)}"
        request = json.dumps(steps)
        for attempt in (1, 2):
            if self._server is None or self._server.done():
                self._start()
            argv = ["socat", "-t", str(int(timeout)), "STDIO", f"UNIX-CONNECT:{CLIENT_SOCK}"]
            res = self.vm.submit(argv, timeout + 30, stdin=request).wait()
            unreached = res.rc != 0 and ("Connection refused" in res.err or "No such file" in res.err)
            if unreached and attempt == 1:
                self._server = None  # gone (a reboot): the batch never ran; start one and send it again
                continue
            lines = res.out.strip().splitlines()
            if res.rc != 0 or not lines:
                raise GuestError(what, res)
            reply: dict[str, Any] = json.loads(lines[-1])
            if "error" in reply:
                raise GuestError(what, Result(1, "", str(reply["error"]), res.seconds))
            results: list[dict[str, Any]] = reply["results"]
            return results
        raise GuestError(what, Result(-1, "", "unreachable", 0.0))
