"""The replica pair of ``tests/cluster/test_replication.py``: the volume's fixed identity and DRBD slot, the test's
stand-in for the controller (:class:`Pair`: roles given in epochs), the verified writer and its read-back, the
replication-link cut, a planned switchover, and a replica's checksum."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.cluster import LabCluster
from lab.fabric import wait_until
from lab.probe import PROBE, IoProbe, ProbeResult
from lab.target import STATE_DIR, GuestTargetAgent
from lab.vm import LabVM
from nvmeof_csi.nvmeof.nqn import volume_nqn

VOL = "5f0c2a6e-2d7b-4c59-9a83-0d6a1f2b7c11"
NQN = volume_nqn(VOL)
SECRET = "6e0f1c2b3a4d5e6f7a8b9c0d1e2f3a4b"
MINOR, PORT, MIB, BLOCKS = 100, 7789, 64, 2048
ROGUE_MIB = 40  # where split_brain writes: past the writer's BLOCKS (8 MiB)


@dataclass
class Pair:
    cluster: LabCluster
    agents: dict[str, GuestTargetAgent]
    head: str
    epoch: int = 1
    dead: str = ""

    def vm(self, name: str) -> LabVM:
        return self.cluster.vm(name)

    def get(self, node: str) -> dict[str, Any]:
        return dict(self.agents[node].ops("get", VOL)["replica"])

    def role(self, node: str, role: str, decision: str = "") -> dict[str, Any]:
        self.epoch += 1
        return dict(self.agents[node].ops("role", VOL, role, str(self.epoch), *([decision] if decision else [])))

    def wait(self, node: str, what: str, ok: Callable[[dict[str, Any]], bool], seconds: float = 120) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def check() -> bool:
            seen.update(self.get(node))
            return ok(seen)

        assert wait_until(check, seconds, 1.0), f"{node}: {what}: {seen}"
        return seen


def spec(cluster: LabCluster, here: str, there: str) -> str:
    return json.dumps({
        "peer_agent": there, "peer_host": there, "peer_address": cluster.address(there, "fa"),
        "address": cluster.address(here, "fa"), "port": str(PORT), "minor": str(MINOR), "secret": SECRET,
    })  # fmt: skip


def cut_replication(cluster: LabCluster, on: bool) -> None:
    """Only the storage-to-storage path: each side drops what it would send to the other's ``fa`` address."""
    for here, there in (("storage-1", "storage-2"), ("storage-2", "storage-1")):
        verb = "add" if on else "del"
        cluster.vm(here).run(["ip", "route", verb, "blackhole", f"{cluster.address(there, 'fa')}/32"], 30)


def writer(pair: Pair, seconds: float) -> IoProbe:
    return IoProbe(pair.vm("gpu-1"), pair.head, seconds, stall_ms=1000, sync=True, blocks=BLOCKS)


def node_of(cluster: LabCluster, address: str) -> str:
    """The storage node a path's ``address`` (``traddr=...,trsvcid=...``) leads to."""
    for node in ("storage-1", "storage-2"):
        if any(f"traddr={cluster.address(node, link)}," in f"{address}," for link in ("fa", "fb")):
            return node
    return address


def written_and_read_back(pair: Pair, probe: IoProbe) -> tuple[ProbeResult, ProbeResult]:
    """The writer's result (stopped: the fault it ran under is over), then every block of the written range read
    from the head with O_DIRECT: each must hold its last acknowledged write."""
    result, gpu = probe.stop(), pair.vm("gpu-1")
    out = gpu.check([gpu.python, str(PROBE), pair.head, "0", "--mode", "check", "--acked", str(result.ios),
                     "--blocks", str(BLOCKS)], timeout=300)  # fmt: skip
    return result, ProbeResult(**json.loads(out.strip().splitlines()[-1]))


def switch(pair: Pair, old: str, new: str) -> float:
    """A planned switchover as the controller's failover pass makes it for a draining node, in one epoch: the old
    primary hands over (portals unlinked, namespace disabled, demoted, never outdated), its peer is promoted,
    the old one made secondary (its portals back). The seconds the three calls took."""
    began = time.monotonic()
    pair.epoch += 1
    for node, role in ((old, "handover"), (new, "primary"), (old, "secondary")):
        out = pair.agents[node].ops("role", VOL, role, str(pair.epoch))
        assert "volume" in out, (node, role, out)
    return time.monotonic() - began


def checksum(pair: Pair, node: str) -> str:
    """The replica's data (its first ``MIB`` MiB: the volume, not DRBD's metadata) read from its backing device
    with O_DIRECT."""
    out = pair.vm(node).check(["sh", "-c", f"dd if=/dev/nvmeof-csi/replica-{VOL} bs=1M count={MIB} "
                                           "iflag=direct status=none | sha256sum"], 120)  # fmt: skip
    return out.split()[0]


def split_brain(pair: Pair) -> None:
    """A split brain made on purpose: storage-1, fenced and cut off, is made Primary by hand (``--force``, its
    fence-peer call answered "fenced": an operator's mistake), 256 KiB written to its DRBD device past the
    writer's blocks, then Secondary again. When the link heals DRBD finds both replicas changed and connects
    neither (every after-sb policy disconnects): the controller's call."""
    one = pair.vm("storage-1")
    res = f"nv-{VOL}"
    adm = ["/usr/lib/drbd/drbdadm-84", "-c", f"{STATE_DIR}/drbd/{res}.res"]
    forced = one.submit([*adm, "--", "--force", "primary", res], timeout=120)

    def promoted() -> bool:
        return forced.done() or pair.agents["storage-1"].ops("answer", VOL, "fenced")["answered"] > 0

    assert wait_until(promoted, 60, 0.5), "the forced promotion neither ended nor asked its fence-peer handler"
    forced.check()
    one.check(["dd", "if=/dev/urandom", f"of=/dev/drbd{MINOR}", "bs=64k", "count=4", f"seek={ROGUE_MIB * 16}",
               "oflag=direct", "status=none"], 60)  # fmt: skip
    one.check([*adm, "secondary", res], 60)


def rogue_region(pair: Pair, node: str) -> str:
    """The checksum of what :func:`split_brain` wrote, read from ``node``'s replica with O_DIRECT."""
    out = pair.vm(node).check(["sh", "-c", f"dd if=/dev/nvmeof-csi/replica-{VOL} bs=64k skip={ROGUE_MIB * 16} "
                                           "count=4 iflag=direct status=none | sha256sum"], 60)  # fmt: skip
    return out.split()[0]
