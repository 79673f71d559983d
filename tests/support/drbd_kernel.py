"""A stand-in for the kernel under a replica (losetup and drbdadm-84 against a model of one DRBD minor in
``/proc/drbd``) and a real agent on a plain configfs tree that replicates through it. The kernel's own behaviour
is proven in ``tests/cluster/test_replication.py``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nvmeof_csi.agent.configfs import Nvmet
from nvmeof_csi.agent.drbd import DrbdResources
from nvmeof_csi.agent.fence_spool import FenceSpool
from nvmeof_csi.agent.replica_devices import LoopLinks
from nvmeof_csi.agent.replicas import Replication
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.errors import CommandError
from nvmeof_csi.host.executor import Result
from tests.support.agents import make_agent


class Kernel:
    """losetup and drbdadm-84 as commands against a model of one DRBD minor; ``peer_disk`` is what the peer says."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.loops: dict[str, str] = {}
        self.minor: dict[str, str] | None = None
        self.peer_disk = "Inconsistent"
        self.number = 11  # the DRBD minor /proc/drbd shows
        self.link = "Connected"  # the connection state a resource comes up in
        self.device_size = 1 << 50  # what sysfs says of the DRBD device's size (grown at once)

    def device_bytes(self, minor: int) -> int:
        return self.device_size

    def proc(self) -> str:
        if self.minor is None:
            return "version: 8.4.11 (api:1/proto:86-101)\n"
        m = self.minor
        counters = (
            f"    ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:{m['oos']}\n" if "oos" in m else ""
        )
        return (
            f"version: 8.4.11\n {self.number}: cs:{m['cs']} ro:{m['ro']}/Secondary ds:{m['ds']}/{m['pds']} C r-----\n"
            + counters
        )

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True, stdin: str | None = None,
            secrets: Sequence[str] = ()) -> Result:  # fmt: skip
        self.calls.append(list(argv))
        if argv[0] == "losetup":
            return self._losetup(list(argv))
        if argv[0] == "modprobe":
            return Result(0, "", "")
        word = argv[-2]
        if word == "up":
            self.minor = {"cs": self.link, "ro": "Secondary", "ds": "Inconsistent", "pds": self.peer_disk}
        elif word == "new-current-uuid" and self.minor is not None:
            self.minor["ds"] = self.minor["pds"] = "UpToDate"
        elif word == "primary" and self.minor is not None:
            if self.minor["ds"] != "UpToDate":
                raise CommandError(list(argv), 17, "", "State change failed: (-2) Need access to UpToDate data")
            self.minor["ro"] = "Primary"
        elif word == "secondary" and self.minor is not None:
            self.minor["ro"] = "Secondary"
        elif word == "outdate" and self.minor is not None:
            if self.minor["cs"] == "Connected":
                raise CommandError(
                    list(argv), 17, "", "State change failed: (-15) Refusing to be Outdated while Connected"
                )
            self.minor["ds"] = "Outdated"
        elif word == "disconnect" and self.minor is not None:
            self.minor["cs"] = "StandAlone"
        elif word == "connect" and self.minor is not None:
            self.minor["cs"] = "WFConnection"
        elif word == "down":
            self.minor = None
        return Result(0, "", "")

    def _losetup(self, argv: list[str]) -> Result:
        if "--associated" in argv:
            return Result(0, "".join(f"{d}\n" for d, f in self.loops.items() if f == argv[-1]), "")
        if "--find" in argv:
            self.loops["/dev/loop7"] = argv[-1]
            return Result(0, "/dev/loop7\n", "")
        if "--detach" in argv:
            self.loops.pop(argv[-1], None)
        return Result(0, "", "")

    def words(self) -> list[str]:
        return [
            c[-2] if c[0] not in ("losetup", "modprobe") else c[1] if c[0] == "losetup" else c[0] for c in self.calls
        ]


def replicated_agent(
    tmp: Path, kernel: Kernel, name: str = "store-a", host: str = "storage-1", address: str = ""
) -> TargetAgent:
    """A real agent on a plain configfs tree whose replicas' kernel is ``kernel`` (this node: ``host``)."""
    base = make_agent(tmp, name=name)
    replication = Replication(
        DrbdResources(kernel, tmp / "drbd", read_proc=kernel.proc, device_bytes=kernel.device_bytes, grow_wait=0.0), LoopLinks(kernel, tmp / "links"), host,
        "/run/nvmeof-csi/drbd/fence-peer", FenceSpool(tmp / "spool", lambda _: None), address=address,
    )  # fmt: skip
    agent = TargetAgent(base.name, Nvmet(tmp / "nvmet", plain_tree=True), base.store, base.state, base.portals,
                        replication=replication)  # fmt: skip
    agent.converge()
    return agent
