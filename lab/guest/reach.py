"""Run in a lab guest: can this machine open a TCP connection to ADDR:PORT within TIMEOUT seconds?

usage: reach.py ADDR PORT TIMEOUT [SOURCE]   prints one JSON line: {"outcome": "connected" | "refused" | "timeout" |
"unreachable", "seconds": S}. "refused" means the peer answered (an RST: nothing listens there), so the path works.
"""

import json
import socket
import sys
import time


def main() -> None:
    addr, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    source = (sys.argv[4], 0) if len(sys.argv) > 4 else None
    t0 = time.monotonic()
    try:
        socket.create_connection((addr, port), timeout=timeout, source_address=source).close()
        outcome = "connected"
    except ConnectionRefusedError:
        outcome = "refused"
    except TimeoutError:
        outcome = "timeout"
    except OSError:
        outcome = "unreachable"
    print(json.dumps({"outcome": outcome, "seconds": round(time.monotonic() - t0, 3)}))


if __name__ == "__main__":
    main()
