"""The egress guard on this machine's real kernel: three network namespaces stand for a GPU node, a pod on it
(forwarded through the node) and a storage node with a portal. With the guard's rules the node still connects
to the portal, the pod is refused at once (EHOSTUNREACH), and the pod still reaches another port of the same
address (ECONNREFUSED from the storage node: the path exists, the refusal is the guard's). Without the rules
the pod connects (checked first, so the proof can fail)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence

import pytest

from nvmeof_csi.host.egress_guard import EgressGuard, parse_guard
from nvmeof_csi.host.executor import Result, SubprocessExecutor
from tests.support.env import need

CONNECT = """
import socket, sys
s = socket.socket()
s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as exc:
    print(exc.errno)
"""
PORTAL, OTHER = 4420, 4499


class InNamespace:
    """An executor whose commands run in one network namespace."""

    def __init__(self, name: str) -> None:
        self.name, self.real = name, SubprocessExecutor()

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True, stdin: str | None = None,
            secrets: Sequence[str] = ()) -> Result:  # fmt: skip
        return self.real.run(["ip", "netns", "exec", self.name, *argv], timeout=timeout, check=check, stdin=stdin)


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=10)


@pytest.fixture
def lab() -> Iterator[dict[str, str]]:
    need(os.geteuid() == 0, "needs root (network namespaces)")
    tag = uuid.uuid4().hex[:6]
    ns = {"node": f"eg-node-{tag}", "pod": f"eg-pod-{tag}", "storage": f"eg-stor-{tag}"}
    for name in ns.values():
        ip("netns", "add", name)
    try:
        for a, b, net_a, net_b in (("node", "storage", "169.254.11.11/24", "169.254.11.1/24"),
                                   ("node", "pod", "10.88.11.1/24", "10.88.11.5/24")):  # fmt: skip
            left, right = f"eg{a[0]}{b[0]}-{tag}", f"eg{b[0]}{a[0]}-{tag}"
            ip("link", "add", left, "netns", ns[a], "type", "veth", "peer", "name", right, "netns", ns[b])
            ip("-n", ns[a], "addr", "add", net_a, "dev", left)
            ip("-n", ns[b], "addr", "add", net_b, "dev", right)
            ip("-n", ns[a], "link", "set", left, "up")
            ip("-n", ns[b], "link", "set", right, "up")
        for name in ns.values():
            ip("-n", name, "link", "set", "lo", "up")
        ip("-n", ns["pod"], "route", "add", "default", "via", "10.88.11.1")
        ip("-n", ns["storage"], "route", "add", "10.88.11.0/24", "via", "169.254.11.11")
        subprocess.run(["ip", "netns", "exec", ns["node"], "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        yield ns
    finally:
        for name in ns.values():
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def connect(ns: str, port: int) -> str:
    argv = ["ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, "169.254.11.1", str(port)]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout.strip()


def test_the_pod_is_refused_the_portal_and_the_node_is_not(lab: dict[str, str]) -> None:
    listen = "import socket, time\ns = socket.create_server(('0.0.0.0', 4420))\nprint('up', flush=True)\ntime.sleep(60)"
    server = subprocess.Popen(["ip", "netns", "exec", lab["storage"], sys.executable, "-c", listen],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        assert connect(lab["pod"], PORTAL) == "connected"  # unguarded: the pod reaches the portal
        guard = EgressGuard(parse_guard("169.254.11.0/24:4420-4421"), InNamespace(lab["node"]))
        assert guard.apply() is True
        assert connect(lab["node"], PORTAL) == "connected"  # the node's own connections go on
        assert connect(lab["pod"], PORTAL) == "113"  # EHOSTUNREACH: administratively prohibited
        assert connect(lab["pod"], OTHER) == "111"  # ECONNREFUSED from the storage node: the path is there
        assert guard.apply() is False
    finally:
        server.kill()
        server.wait(10)
