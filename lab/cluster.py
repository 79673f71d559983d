"""A lab cluster: ``storage-1`` (the target) and ``gpu-1``, ``gpu-2`` (initiators), and in the cluster tier
``storage-2`` (``WITH_PEER``: ``storage-1``'s DRBD replication peer), each a VM with its own kernel and host name,
its own host identity and scratch disk, wired by links that share nothing (``lab/links.py``):

| link | addresses | carries |
|---|---|---|
| ``mgmt`` | 169.254.10.<n>/24 | the control plane (the agent's gRPC, the driver's calls) |
| ``fa`` | 169.254.11.<n>/24 | fabric path A (NVMe/TCP, soft-RoCE) |
| ``fb`` | 169.254.12.<n>/24 | fabric path B |

``<n>`` is 1 and 2 for ``storage-1`` and ``storage-2``, 11 and 12 for ``gpu-1`` and ``gpu-2``. In each guest the
NICs are named after their link. Every VM keeps the lab's management channel (virtio-serial) besides, which no fault
touches.

Faults, each one call with its undo (per VM and link unless said): :meth:`LabCluster.link_down` /
:meth:`~LabCluster.link_up` (a pulled cable: the guest sees its carrier go, the host end is down);
:meth:`~LabCluster.black_hole` / :meth:`~LabCluster.restore` (frames dropped both ways, no RST, carrier up);
:meth:`~LabCluster.netem` / :meth:`~LabCluster.clear_netem` (delay and loss on the VM's side of the link);
per VM: :meth:`~LabCluster.freeze` / :meth:`~LabCluster.resume` (SIGSTOP/SIGCONT of its QEMU),
:meth:`~LabCluster.power_cut` / :meth:`~LabCluster.boot`, and :meth:`~LabCluster.cut_management` /
:meth:`~LabCluster.restore_management` (its ``mgmt`` link black-holed, fabric links up).

Contract: :meth:`LabCluster.start` boots every VM at once and returns when each guest is ready with its links
addressed; on failure nothing is left running. :meth:`LabCluster.close` stops every VM and removes the links.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.build import LAB_DIR
from lab.fabric import wait_until
from lab.guest_calls import LabError
from lab.links import LabLinks
from lab.vm import LabVM

LINKS = ("mgmt", "fa", "fb")
REACH = LAB_DIR / "guest" / "reach.py"
SUBNETS = {"mgmt": 10, "fa": 11, "fb": 12}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    index: int  # the last octet of its addresses
    mem_mb: int = 1024
    cpus: int = 1


NODES = (NodeSpec("storage-1", 1, 1536, 2), NodeSpec("gpu-1", 11), NodeSpec("gpu-2", 12))
#: the cluster tier's machines: the three, and ``storage-2``, the replication peer of ``storage-1``
WITH_PEER = (NODES[0], NodeSpec("storage-2", 2, 1024, 1), *NODES[1:])


def address(node: NodeSpec, link: str) -> str:
    return f"169.254.{SUBNETS[link]}.{node.index}"


def mac(node: NodeSpec, link: str) -> str:
    return f"52:54:00:4c:{SUBNETS[link]:02x}:{node.index:02x}"


def qmp(path: str, command: str, **arguments: Any) -> Any:
    """One QMP command on QEMU's monitor socket; its ``return`` value (``LabError`` for an ``error``)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        lines = sock.makefile("rwb")

        def call(execute: str, args: dict[str, Any]) -> Any:
            lines.write(json.dumps({"execute": execute, **({"arguments": args} if args else {})}).encode() + b"\n")
            lines.flush()
            while True:  # events may come first
                reply = json.loads(lines.readline())
                if "return" in reply:
                    return reply["return"]
                if "error" in reply:
                    raise LabError(f"QMP {execute}: {reply['error'].get('desc')}")

        json.loads(lines.readline())  # the greeting
        call("qmp_capabilities", {})
        return call(command, arguments)


class LabCluster:
    def __init__(
        self,
        nodes: Sequence[NodeSpec] = NODES,
        kernel: str | None = None,
        scratch_gb: int = 4,
        scratch_from: Path | None = None,
        extra_nic: Sequence[str] = (),
    ) -> None:
        """``scratch_from``: a saved scratch disk every VM starts from (a copy each; ``scratch_gb`` its size);
        ``extra_nic``: QEMU arguments of one more NIC in every VM, before the links (the Kubernetes tier's
        restricted user network to the API server)."""
        self.nodes = {n.name: n for n in nodes}
        self.kernel = kernel
        self.scratch_gb, self.scratch_from, self.extra_nic = scratch_gb, scratch_from, list(extra_nic)
        self.links = LabLinks(LINKS)
        self.vms: dict[str, LabVM] = {}
        self._closing = threading.Event()

    def vm(self, name: str) -> LabVM:
        return self.vms[name]

    def address(self, name: str, link: str) -> str:
        return address(self.nodes[name], link)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> LabCluster:
        self.links.create()
        try:
            for node in self.nodes.values():
                fds, nic = [], list(self.extra_nic)
                for link in LINKS:
                    fd = self.links.add_port(node.name, link)
                    fds.append(fd)
                    nic += ["-netdev", f"tap,id={link},fd={fd}"]
                    nic += ["-device", f"virtio-net-pci,netdev={link},mac={mac(node, link)}"]
                vm = LabVM(
                    mem_mb=node.mem_mb,
                    cpus=node.cpus,
                    scratch_gb=self.scratch_gb,
                    kernel=self.kernel,
                    nic=nic,
                    pass_fds=fds,
                    scratch_from=self.scratch_from,
                )
                self.vms[node.name] = vm
            self._each(self.boot)
        except BaseException:
            self.close()
            raise
        return self

    def _each(self, work: Callable[[str], object]) -> None:
        """``work(name)`` for every node at once; the first failure is raised after all have ended. The threads
        live on until :meth:`close`: a QEMU dies with the thread that started it (``PR_SET_PDEATHSIG``)."""
        errors: list[BaseException] = []
        done = [threading.Event() for _ in self.nodes]

        def run(name: str, finished: threading.Event) -> None:
            try:
                work(name)
            except BaseException as exc:  # collected, raised below
                errors.append(exc)
            finished.set()
            self._closing.wait()

        for name, finished in zip(self.nodes, done, strict=True):
            threading.Thread(target=run, args=(name, finished), daemon=True).start()
        for finished in done:
            finished.wait()
        if errors:
            raise errors[0]

    def boot(self, name: str) -> float:
        """Boot ``name`` (again, after :meth:`power_cut`) and address its links; the boot's seconds. Its QEMU
        lives as long as the calling thread."""
        vm = self.vms[name]
        vm.start()
        node = self.nodes[name]
        vm.check(["date", "-s", f"@{time.time():.3f}"])  # the RTC gave whole seconds: set it as a time daemon would
        vm.write("/proc/sys/kernel/hostname", name)  # DRBD picks its side of a resource by it (uname -n)
        vm.check(["modprobe", "virtio_net"])
        by_mac: dict[str, str] = {}

        def nics_seen() -> bool:
            by_mac.update({vm.read(f"/sys/class/net/{i}/address").strip(): i for i in vm.listdir("/sys/class/net")})
            return all(mac(node, link) in by_mac for link in LINKS)

        wait_until(nics_seen, 30, 0.5)
        for link in LINKS:
            ifname = by_mac.get(mac(node, link))
            if ifname is None:
                raise LabError(f"{name}: no NIC with MAC {mac(node, link)} ({by_mac})")
            if ifname != link:
                vm.check(["ip", "link", "set", "dev", ifname, "name", link])
            vm.check(["ip", "addr", "replace", f"{address(node, link)}/24", "dev", link])
            vm.check(["ip", "link", "set", "dev", link, "up"])
        return vm.boot_seconds

    def close(self) -> None:
        for vm in self.vms.values():
            if vm.proc is not None and vm.proc.poll() is None:
                os.kill(vm.proc.pid, signal.SIGCONT)  # a frozen VM cannot power off
            vm.close()
        self.vms.clear()
        self.links.remove()
        self._closing.set()

    def __enter__(self) -> LabCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reach(self, src: str, dst: str, link: str, port: int = 4420, timeout: float = 3.0) -> tuple[str, float]:
        """Can ``src`` open a TCP connection to ``dst``'s address on ``link``? (outcome, seconds): ``refused``
        and ``connected`` mean the path works, ``timeout`` that packets vanish (``lab/guest/reach.py``)."""
        vm = self.vms[src]
        argv = [vm.python, str(REACH), self.address(dst, link), str(port), str(timeout)]
        doc = json.loads(vm.check(argv, timeout=timeout + 60).strip().splitlines()[-1])
        return str(doc["outcome"]), float(doc["seconds"])

    def usage(self, seconds: float = 10.0) -> dict[str, tuple[int, float]]:
        """Each VM's QEMU on the host: (resident MiB, CPU % of one core over ``seconds``)."""

        def sample() -> dict[str, tuple[int, float]]:
            found = {}
            for name, vm in self.vms.items():
                assert vm.proc is not None
                status = Path(f"/proc/{vm.proc.pid}/status").read_text().split()
                fields = Path(f"/proc/{vm.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                found[name] = (int(status[status.index("VmRSS:") + 1]) >> 10, ticks)
            return found

        before, t0 = sample(), time.monotonic()
        time.sleep(seconds)
        after, spent = sample(), time.monotonic() - t0
        return {n: (after[n][0], round(100 * (after[n][1] - before[n][1]) / spent, 1)) for n in after}

    # -- faults --------------------------------------------------------------------------------------------
    def link_down(self, name: str, link: str) -> None:
        """Pull ``name``'s cable on ``link``: its carrier goes (QMP ``set_link``) and the host end is down."""
        qmp(str(self.vms[name].qmp_socket), "set_link", name=link, up=False)
        self.links.tap_down(name, link)

    def link_up(self, name: str, link: str) -> None:
        self.links.tap_up(name, link)
        qmp(str(self.vms[name].qmp_socket), "set_link", name=link, up=True)

    def black_hole(self, name: str, link: str) -> None:
        self.links.black_hole(name, link)

    def restore(self, name: str, link: str) -> None:
        self.links.restore(name, link)

    def cut_management(self, name: str) -> None:
        self.links.black_hole(name, "mgmt")

    def restore_management(self, name: str) -> None:
        self.links.restore(name, "mgmt")

    def netem(self, name: str, link: str, delay_ms: int = 0, loss_pct: float = 0.0) -> None:
        """Delay and loss on what ``name`` sends on ``link`` (netem in its kernel; undo: :meth:`clear_netem`)."""
        argv = ["tc", "qdisc", "replace", "dev", link, "root", "netem", "delay", f"{delay_ms}ms"]
        self.vms[name].check([*argv, "loss", f"{loss_pct}%"] if loss_pct else argv)

    def clear_netem(self, name: str, link: str) -> None:
        self.vms[name].run(["tc", "qdisc", "del", "dev", link, "root"], 10)

    def freeze(self, name: str) -> None:
        """SIGSTOP ``name``'s QEMU: the VM stops dead, its links stay up (undo: :meth:`resume`)."""
        self._signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self._signal(name, signal.SIGCONT)

    def _signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.vms[name].proc
        if proc is None or proc.poll() is not None:
            raise LabError(f"{name} is not running")
        os.kill(proc.pid, sig)

    def power_cut(self, name: str) -> None:
        """Cut ``name``'s power (its guest never syncs); :meth:`boot` brings it back with the same disk."""
        self.vms[name].power_cut()
