"""A resident CSI client inside a lab VM: :mod:`lab.csi_ops` batches served on a Unix socket, so a batch costs
one ``socat`` start instead of a Python start (grpc and the CSI stubs imported under TCG: seconds each).

usage: python -m lab.csi_serve DRIVER_SOCKET CLIENT_SOCKET

Protocol: a client connects, sends one JSON list of steps (as ``lab.csi_ops`` takes them) and shuts down its
writing half; the answer is one JSON line, ``{"results": [...]}`` or ``{"error": "csi_ops: CODE: details"}``,
then the connection closes. Each connection is served in its own thread against a fresh gRPC channel, as
separate ``lab.csi_ops`` processes would be.

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

import grpc

from lab.csi_ops import run


class Handler(socketserver.StreamRequestHandler):
    server: Server

    def handle(self) -> None:
        reply: dict[str, object]
        try:
            reply = {"results": run(self.server.driver_socket, json.loads(self.rfile.read()))}
        except grpc.RpcError as err:
            reply = {"error": f"csi_ops: {err.code().name}: {err.details()}"}
        except Exception as exc:
            reply = {"error": f"csi_ops: {type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, driver_socket: str, path: str) -> None:
        self.driver_socket = driver_socket
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    server = Server(argv[0], argv[1])
    threading.Thread(target=watch, args=(server, argv[1]), daemon=True).start()
    print(f"csi_serve: serving {argv[0]} on {argv[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
