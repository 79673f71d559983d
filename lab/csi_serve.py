"""A resident client inside a lab VM: :mod:`lab.csi_ops` batches (``csi``) or :mod:`lab.agent_ops` calls
(``agent``) served on a Unix socket, so a call costs one ``socat`` start instead of a Python start (grpc and the
stubs imported under TCG: seconds each).

usage: python -m lab.csi_serve csi|agent TARGET_SOCKET CLIENT_SOCKET

Protocol: a client connects, sends one JSON request and shuts down its writing half: for ``csi`` a list of steps
(as ``lab.csi_ops`` takes them), for ``agent`` the argument list of one ``lab.agent_ops`` call (without the
socket). The answer is one JSON line, ``{"results": ...}`` or ``{"error": "<kind>: CODE: details"}``, then the
connection closes. Each connection is served in its own thread against a fresh gRPC channel, as separate
processes would be.

Contract: the socket appears only once it accepts (bound under a temporary name, then renamed); the server exits
when its socket path is removed or replaced by another server's, so a restarted client leaves none behind.
"""

from __future__ import annotations

import json
import os
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from lab import agent_ops, csi_ops


class Handler(socketserver.StreamRequestHandler):
    server: Server

    def handle(self) -> None:
        reply: dict[str, object]
        kind = self.server.kind
        try:
            reply = {"results": self.server.serve(json.loads(self.rfile.read()))}
        except grpc.RpcError as err:
            reply = {"error": f"{kind}: {err.code().name}: {err.details()}"}
        except (Exception, SystemExit) as exc:  # a refusal (DriverError), or SystemExit for an unknown call
            reply = {"error": f"{kind}: {type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, kind: str, serve: Callable[[Any], Any], path: str) -> None:
        self.kind, self.serve = kind, serve
        tmp = f"{path}.{os.getpid()}"
        super().__init__(tmp, Handler)
        os.rename(tmp, path)  # listening already: whoever sees the path can connect
        self.inode = os.stat(path).st_ino


def watch(server: Server, path: str) -> None:
    """Shut ``server`` down once ``path`` is no longer its socket."""
    while True:
        time.sleep(5)
        try:
            if os.stat(path).st_ino == server.inode:
                continue
        except FileNotFoundError:
            pass
        server.shutdown()
        return


def server_for(kind: str, target: str, path: str) -> Server:
    if kind == "csi":
        return Server("csi_ops", lambda steps: csi_ops.run(target, steps), path)
    return Server("agent_ops", lambda args: agent_ops.main([target, *map(str, args)]), path)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("csi", "agent"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, target, path = argv
    server = server_for(kind, target, path)
    threading.Thread(target=watch, args=(server, path), daemon=True).start()
    print(f"csi_serve: {kind} calls to {target} on {path}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
