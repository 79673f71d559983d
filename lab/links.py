"""Virtual Ethernet links between lab VMs, built on the host without touching the host's network.

Layout: one network namespace per cluster (``nvmeof-lab-<pid>``) holding one bridge per link (``br-<link>``) and
one persistent tap per VM and link (``<vm>-<link>``, at most 15 characters). The tap is opened from inside the
namespace and its file descriptor handed to QEMU (``-netdev tap,fd=N``), so QEMU itself stays in the host's
namespace (its management channel and any user-mode network keep working) while its NICs exist only in the lab's
namespace: no host interface, address, route or firewall rule is made or changed. Addresses are link-local and
exist only inside the VMs.

Faults applied here, on the host side, each with its undo:
- :meth:`LabLinks.black_hole` / :meth:`LabLinks.restore`: the VM's bridge port stops forwarding (state
  *disabled*): every frame to and from the VM on that link is dropped, no RST, no carrier change in the VM;
- :meth:`LabLinks.tap_down` / :meth:`LabLinks.tap_up`: the host end of the cable (QEMU's writes to it fail).
The guest side of a cable pull (carrier off) is QEMU's ``set_link`` (``lab/cluster.py``). Delay and loss are
netem in the guest (the host kernel has no ``sch_netem``; the lab's guest kernels do).

Contract: :meth:`LabLinks.create` is all or nothing; :meth:`LabLinks.remove` deletes the namespace (every bridge
and tap with it) and closes the descriptors; calling it twice is harmless.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import subprocess
from collections.abc import Sequence

from lab.guest_calls import LabError

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
MAX_IFNAME = 15
FORWARDING, DISABLED = "3", "0"  # bridge port states


def _ip(*argv: str) -> str:
    """``ip`` with ``argv``; ``LabError`` with its message when it fails."""
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise LabError(f"ip {' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


class LabLinks:
    """The links of one lab cluster: ``links`` are the link names (``mgmt``, ``fa``, ``fb``, ...)."""

    def __init__(self, links: Sequence[str], namespace: str | None = None) -> None:
        self.links = tuple(links)
        self.namespace = namespace or f"nvmeof-lab-{os.getpid()}"
        self._fds: dict[str, int] = {}

    def create(self) -> LabLinks:
        _ip("netns", "add", self.namespace)
        try:
            for link in self.links:
                _ip("-n", self.namespace, "link", "add", f"br-{link}", "type", "bridge", "forward_delay", "0")
                _ip("-n", self.namespace, "link", "set", f"br-{link}", "up")
        except LabError:
            self.remove()
            raise
        return self

    @staticmethod
    def tap_name(vm: str, link: str) -> str:
        name = f"{vm}-{link}"
        if len(name) > MAX_IFNAME:
            raise LabError(f"tap name {name!r} is longer than {MAX_IFNAME} characters")
        return name

    def add_port(self, vm: str, link: str) -> int:
        """A tap for ``vm`` on ``link``, plugged into the link's bridge; returns its open descriptor (kept open
        here until :meth:`remove`, so a VM booted again gets the same cable)."""
        tap = self.tap_name(vm, link)
        if tap in self._fds:
            return self._fds[tap]
        _ip("-n", self.namespace, "tuntap", "add", "dev", tap, "mode", "tap")
        _ip("-n", self.namespace, "link", "set", tap, "master", f"br-{link}")
        _ip("-n", self.namespace, "link", "set", tap, "up")
        self._fds[tap] = self._open_tap(tap)
        return self._fds[tap]

    def _open_tap(self, tap: str) -> int:
        """Open ``tap`` from inside the namespace (setns on this thread only, then back)."""
        libc = ctypes.CDLL(None, use_errno=True)
        here = os.open("/proc/self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{self.namespace}", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise LabError(f"setns into {self.namespace}: {os.strerror(ctypes.get_errno())}")
            try:
                fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
                fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
            finally:
                if libc.setns(here, CLONE_NEWNET) != 0:  # never leave this thread in the lab's namespace
                    raise LabError(f"setns back to the host: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(here)
            os.close(there)
        return fd

    def _port_state(self, vm: str, link: str, state: str) -> None:
        _ip("netns", "exec", self.namespace, "bridge", "link", "set", "dev", self.tap_name(vm, link), "state", state)

    def black_hole(self, vm: str, link: str) -> None:
        """Drop every frame to and from ``vm`` on ``link`` (undo: :meth:`restore`)."""
        self._port_state(vm, link, DISABLED)

    def restore(self, vm: str, link: str) -> None:
        self._port_state(vm, link, FORWARDING)

    def tap_down(self, vm: str, link: str) -> None:
        _ip("-n", self.namespace, "link", "set", self.tap_name(vm, link), "down")

    def tap_up(self, vm: str, link: str) -> None:
        _ip("-n", self.namespace, "link", "set", self.tap_name(vm, link), "up")
        self.restore(vm, link)  # a port that comes up again starts forwarding (no STP on lab bridges)

    def port_state(self, vm: str, link: str) -> str:
        """The bridge port's state as ``ip`` shows it (``forwarding``, ``disabled``, ...)."""
        out = _ip("-n", self.namespace, "-d", "link", "show", "dev", self.tap_name(vm, link))
        words = out.split()
        return words[words.index("bridge_slave") + 2] if "bridge_slave" in words else "none"

    def remove(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if os.path.exists(f"/run/netns/{self.namespace}"):
            _ip("netns", "del", self.namespace)
