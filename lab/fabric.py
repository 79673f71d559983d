"""Fabric helpers for lab tests: the kernel NVMe-oF target (nvmet configfs), the kernel initiator, soft-RoCE,
and fault injection, all driven in the guest as file operations and argv commands (no shell snippets).

Contract: target objects are matched by whole NQN / port ID; every helper is idempotent where that makes
sense (``add_*`` on an existing object re-applies attributes); :meth:`Fabric.clear` returns the guest to "no
controllers, no target objects, no tc rules, no mounts under /mnt/lab". Subsystems always carry a host
allow-list; ``allow_any_host`` is never set.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lab.vm import GuestError, LabError, LabVM

NVMET = "/sys/kernel/config/nvmet"
HOST_MODULES = ("nvme-core", "nvme-fabrics", "nvme-tcp")
TARGET_MODULES = ("nvmet", "nvmet-tcp")
RDMA_MODULES = ("crc32_generic", "rdma_rxe", "ib_uverbs", "rdma_ucm", "nvmet-rdma", "nvme-rdma")
ANA_STATES = ("optimized", "non-optimized", "inaccessible", "persistent-loss", "change")


@dataclass(frozen=True)
class Portal:
    port_id: int
    trtype: str
    traddr: str
    trsvcid: int
    tls: bool = False  # a portal that requires TLS 1.3 (the agent's ``:tls`` portals)


@dataclass(frozen=True)
class PathState:
    """One controller (path) of a subsystem as the initiator sees it."""

    controller: str
    state: str
    transport: str
    address: str
    ana_state: str


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


class Fabric:
    def __init__(self, vm: LabVM) -> None:
        self.vm = vm

    # -- modules -----------------------------------------------------------------------------------------
    def load(self, rdma: bool = False) -> None:
        """Load host and target modules (native multipath on), and soft-RoCE + NVMe/RDMA with ``rdma``."""
        self.vm.check(["modprobe", "nvme-core", "multipath=Y"])
        for mod in (*HOST_MODULES[1:], *TARGET_MODULES, "tcp_diag", *(RDMA_MODULES if rdma else ())):
            self.vm.check(["modprobe", mod])

    def multipath_enabled(self) -> bool:
        return self.vm.read("/sys/module/nvme_core/parameters/multipath").strip() == "Y"

    # -- target ------------------------------------------------------------------------------------------
    def add_subsystem(
        self, nqn: str, backing: str, hosts: Sequence[str], nsid: int = 1, ns_uuid: str | None = None
    ) -> str:
        """Subsystem ``nqn`` with one namespace on ``backing`` (file or block device), allowed to ``hosts``.
        Returns the namespace UUID."""
        sub = f"{NVMET}/subsystems/{nqn}"
        self.vm.mkdir(sub)
        self.vm.write(f"{sub}/attr_allow_any_host", "0")
        for host in hosts:
            self.vm.mkdir(f"{NVMET}/hosts/{host}")
            if not self.vm.exists(f"{sub}/allowed_hosts/{host}"):
                self.vm.symlink(f"{NVMET}/hosts/{host}", f"{sub}/allowed_hosts/{host}")
        ns = f"{sub}/namespaces/{nsid}"
        self.vm.mkdir(ns)
        ns_uuid = ns_uuid or str(uuid.uuid4())
        if self.vm.read(f"{ns}/enable").strip() != "1":
            self.vm.write(f"{ns}/device_path", backing)
            self.vm.write(f"{ns}/device_uuid", ns_uuid)
            self.vm.write(f"{ns}/enable", "1")
        return self.vm.read(f"{ns}/device_uuid").strip()

    def add_port(self, portal: Portal) -> None:
        port = f"{NVMET}/ports/{portal.port_id}"
        self.vm.mkdir(port)
        if self.vm.read(f"{port}/addr_traddr").strip() != portal.traddr:
            self.vm.write(f"{port}/addr_adrfam", "ipv6" if ":" in portal.traddr else "ipv4")
            self.vm.write(f"{port}/addr_trtype", portal.trtype)
            self.vm.write(f"{port}/addr_traddr", portal.traddr)
            self.vm.write(f"{port}/addr_trsvcid", str(portal.trsvcid))

    def link(self, port_id: int, nqn: str) -> None:
        link = f"{NVMET}/ports/{port_id}/subsystems/{nqn}"
        if not self.vm.exists(link):
            self.vm.symlink(f"{NVMET}/subsystems/{nqn}", link)

    def unlink(self, port_id: int, nqn: str) -> None:
        """Remove ``nqn`` from a port: every host controller on that path loses its connection."""
        link = f"{NVMET}/ports/{port_id}/subsystems/{nqn}"
        if self.vm.exists(link):
            self.vm.unlink(link)

    def remove_port(self, port_id: int) -> None:
        port = f"{NVMET}/ports/{port_id}"
        if not self.vm.exists(port):
            return
        for nqn in self.vm.listdir(f"{port}/subsystems"):
            self.vm.unlink(f"{port}/subsystems/{nqn}")
        for group in self.vm.listdir(f"{port}/ana_groups"):
            if group != "1":
                self.vm.rmdir(f"{port}/ana_groups/{group}")
        self.vm.rmdir(port)

    def set_ana(self, port_id: int, state: str, group: int = 1) -> None:
        if state not in ANA_STATES:
            raise ValueError(f"ANA state must be one of {ANA_STATES}")
        self.vm.write(f"{NVMET}/ports/{port_id}/ana_groups/{group}/ana_state", state)

    def ana_state(self, port_id: int, group: int = 1) -> str:
        return self.vm.read(f"{NVMET}/ports/{port_id}/ana_groups/{group}/ana_state").strip()

    def clear_target(self) -> None:
        for port in self.vm.listdir(f"{NVMET}/ports") if self.vm.exists(NVMET) else []:
            self.remove_port(int(port))
        for nqn in self.vm.listdir(f"{NVMET}/subsystems") if self.vm.exists(NVMET) else []:
            sub = f"{NVMET}/subsystems/{nqn}"
            for host in self.vm.listdir(f"{sub}/allowed_hosts"):
                self.vm.unlink(f"{sub}/allowed_hosts/{host}")
            for nsid in self.vm.listdir(f"{sub}/namespaces"):
                self.vm.write(f"{sub}/namespaces/{nsid}/enable", "0")
                self.vm.rmdir(f"{sub}/namespaces/{nsid}")
            self.vm.rmdir(sub)
        for host in self.vm.listdir(f"{NVMET}/hosts") if self.vm.exists(NVMET) else []:
            self.vm.rmdir(f"{NVMET}/hosts/{host}")

    # -- soft-RoCE -----------------------------------------------------------------------------------------
    def setup_rxe(self, ifname: str = "rdum0", addrs: Sequence[str] = ("169.254.77.1",)) -> None:
        """A dummy netdev with link-local addresses inside the NIC-less guest, and an rxe device on it
        (rdma_cm cannot use 127/8). These addresses exist only inside the VM."""
        if self.vm.run(["ip", "link", "show", ifname], 10).rc != 0:
            self.vm.check(["ip", "link", "add", ifname, "type", "dummy"])
        self.vm.check(["ip", "link", "set", ifname, "up"])
        have = self.vm.check(["ip", "-o", "addr", "show", "dev", ifname])
        for addr in addrs:
            if f" {addr}/" not in have:
                self.vm.check(["ip", "addr", "add", f"{addr}/32", "dev", ifname])
        if f"rxe_{ifname}" not in self.vm.check(["rdma", "link", "show"]):
            self.vm.check(["rdma", "link", "add", f"rxe_{ifname}", "type", "rxe", "netdev", ifname])

    # -- initiator -----------------------------------------------------------------------------------------
    def connect(
        self,
        portal: Portal,
        nqn: str,
        ctrl_loss_tmo: int = 60,
        reconnect_delay: int = 1,
        keep_alive_tmo: int = 5,
        extra: Sequence[str] = (),
    ) -> None:
        self.vm.check(
            [
                "nvme",
                "connect",
                "-t",
                portal.trtype,
                "-a",
                portal.traddr,
                "-s",
                str(portal.trsvcid),
                "-n",
                nqn,
                f"--ctrl-loss-tmo={ctrl_loss_tmo}",
                f"--reconnect-delay={reconnect_delay}",
                f"--keep-alive-tmo={keep_alive_tmo}",
                *extra,
            ],
            timeout=60,
        )

    def _subsystem_dir(self, nqn: str) -> str | None:
        base = "/sys/class/nvme-subsystem"
        for sub in self.vm.listdir(base) if self.vm.exists(base) else []:
            res = self.vm.run(["cat", f"{base}/{sub}/subsysnqn"], 10)
            if res.rc == 0 and res.out.strip() == nqn:
                return f"{base}/{sub}"
        return None

    def head_device(self, nqn: str, nsid: int = 1) -> str | None:
        """The native-multipath head block device of ``nqn``'s namespace ``nsid`` (found in sysfs)."""
        sub = self._subsystem_dir(nqn)
        if sub is None:
            return None
        for entry in self.vm.listdir(sub):
            if entry.startswith("nvme") and "n" in entry[4:] and "c" not in entry[4:]:
                res = self.vm.run(["cat", f"/sys/block/{entry}/nsid"], 10)
                if res.rc == 0 and res.out.strip() == str(nsid):
                    return f"/dev/{entry}"
        return None

    def wait_head(self, nqn: str, timeout: float = 20) -> str:
        """The head device of ``nqn``'s namespace once it appears; ``LabError`` when it does not in time."""
        if not wait_until(lambda: self.head_device(nqn) is not None, timeout):
            raise LabError(f"no namespace head of {nqn} appeared within {timeout:.0f}s")
        head = self.head_device(nqn)
        assert head is not None
        return head

    def paths(self, nqn: str, nsid: int = 1) -> list[PathState]:
        """Every controller of ``nqn`` with its state and the ANA state of its path to namespace ``nsid``."""
        sub = self._subsystem_dir(nqn)
        if sub is None:
            return []
        instance = sub.rsplit("nvme-subsys", 1)[1]
        paths = []
        for ctrl in sorted(e for e in self.vm.listdir(sub) if e.startswith("nvme") and e[4:].isdigit()):
            base = f"/sys/class/nvme/{ctrl}"
            fields = [self.vm.run(["cat", f"{base}/{f}"], 10).out.strip() for f in ("state", "transport", "address")]
            ana = self.vm.run(["cat", f"/sys/block/nvme{instance}c{ctrl[4:]}n{nsid}/ana_state"], 10).out.strip()
            paths.append(PathState(ctrl, fields[0], fields[1], fields[2], ana))
        return paths

    def wait_paths(self, nqn: str, live: int, timeout: float = 30) -> list[PathState]:
        if not wait_until(lambda: sum(p.state == "live" for p in self.paths(nqn)) == live, timeout):
            raise GuestError(f"{nqn}: waiting for {live} live paths", self.vm.run(["nvme", "list-subsys"], 10))
        return self.paths(nqn)

    def disconnect_all(self) -> None:
        self.vm.run(["nvme", "disconnect-all"], timeout=60)

    # -- faults --------------------------------------------------------------------------------------------
    def blackhole(self, trsvcid: int, on: bool) -> None:
        """Silently drop host->target TCP segments to ``trsvcid`` on lo (a dead link, not a refused one)."""
        if on:
            if "prio" not in self.vm.check(["tc", "qdisc", "show", "dev", "lo"]):
                self.vm.check(["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "prio"])
            self.vm.check(
                [
                    "tc",
                    "filter",
                    "add",
                    "dev",
                    "lo",
                    "parent",
                    "1:",
                    "protocol",
                    "ip",
                    "prio",
                    "1",
                    "u32",
                    "match",
                    "ip",
                    "dport",
                    str(trsvcid),
                    "0xffff",
                    "action",
                    "drop",
                ]
            )
        else:
            self.vm.run(["tc", "qdisc", "del", "dev", "lo", "root"], 10)

    def all_paths_down(self, nqn: str, port_ids: Sequence[int], seconds: float) -> None:
        """Take ``nqn`` off every port for ``seconds``, then bring every path back."""
        for port in port_ids:
            self.unlink(port, nqn)
        time.sleep(seconds)
        for port in port_ids:
            self.link(port, nqn)

    # -- cleanup -------------------------------------------------------------------------------------------
    def clear(self) -> None:
        """Back to a clean guest: no mounts under /mnt/lab, no controllers, no tc rules, no target objects."""
        mounts = [line.split()[1] for line in self.vm.read("/proc/mounts").splitlines() if " /mnt/lab" in line]
        for mount_point in sorted(mounts, reverse=True):
            self.vm.run(["umount", "-l", mount_point], 30)
        self.blackhole(0, on=False)
        self.disconnect_all()
        self.clear_target()
