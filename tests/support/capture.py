"""A packet capture in a lab guest, for the NVMe/TCP TLS proofs: what crossed the wire, and whether a marker
written through a volume is in it in clear text."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lab.fabric import wait_until
from lab.vm import LabVM


@contextmanager
def captured(vm: LabVM, ports: tuple[int, ...], interface: str = "lo") -> Iterator[str]:
    """tcpdump of the TCP ``ports`` on ``interface`` of ``vm`` (``any``: every one); yields the capture file,
    complete once the block ends."""
    pcap, log = "/tmp/tls-capture.pcap", "/tmp/tls-capture.log"
    wanted = " or ".join(f"tcp port {p}" for p in ports)
    pid = vm.check(
        [
            "sh",
            "-c",
            f"rm -f {pcap}; setsid tcpdump -i {interface} -n -s 0 -B 32768 -U -w {pcap} '{wanted}' >{log} 2>&1 & "
            "echo $!",
        ]
    ).strip()
    assert wait_until(lambda: "listening on" in vm.run(["cat", log], 10).out, 30), vm.run(["cat", log], 10).out
    try:
        yield pcap
    finally:
        vm.run(["kill", "-INT", pid], 10)
        wait_until(lambda: vm.run(["kill", "-0", pid], 10).rc != 0, 30)


def copies(vm: LabVM, pcap: str, marker: str) -> tuple[int, int]:
    """(bytes captured, capture lines holding ``marker``)."""
    size = int(vm.check(["stat", "-c", "%s", pcap]).strip())
    found = vm.run(["grep", "-c", "-a", "-F", marker, pcap], 60)
    return size, int(found.out.strip() or 0)
