"""NVMe-oF between machines: the kernel target on ``storage-1``, the kernel initiator on ``gpu-1`` over two links
that share nothing (NVMe/TCP, and NVMe/RDMA over soft-RoCE on the fabric NICs), failing over under a write+verify
I/O probe when a link is black-holed or pulled. Each stall is reported; a single path's stall proves the fault."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from lab import Fabric, IoProbe, Portal
from lab.cluster import LabCluster

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]
NQN = "nqn.2026-11.io.nvmeof:vol:5c1a2b3d-0000-4000-8000-00000000c001"
KATO = 5


def portals(cluster: LabCluster, trtype: str) -> tuple[Portal, Portal]:
    base = 1 if trtype == "tcp" else 3
    return (
        Portal(base, trtype, cluster.address("storage-1", "fa"), 4420),
        Portal(base + 1, trtype, cluster.address("storage-1", "fb"), 4420),
    )


@pytest.fixture
def fabrics(cluster: LabCluster) -> Iterator[tuple[Fabric, Fabric]]:
    """(target on storage-1, initiator on gpu-1), both clean before and after; a 256 MiB namespace allowed to both
    GPU nodes, not yet on any port."""
    target, host = Fabric(cluster.vm("storage-1")), Fabric(cluster.vm("gpu-1"))
    for each in (host, target):
        each.clear()
    cluster.vm("storage-1").check(["truncate", "-s", "256M", "/scratch/across.img"])
    hosts = [cluster.vm("gpu-1").hostnqn, cluster.vm("gpu-2").hostnqn]
    target.add_subsystem(NQN, "/scratch/across.img", hosts=hosts)
    yield target, host
    for each in (host, target):
        each.clear()


def serve(cluster: LabCluster, target: Fabric, host: Fabric, trtype: str, paths: int) -> str:
    """The namespace on ``paths`` portals of ``trtype`` (A optimized, B non-optimized), connected from gpu-1;
    returns the multipath head device."""
    if trtype == "rdma":
        for name in ("storage-1", "gpu-1"):
            vm = cluster.vm(name)
            for link in ("fa", "fb"):
                if f"rxe_{link}" not in vm.check(["rdma", "link", "show"]):
                    vm.check(["rdma", "link", "add", f"rxe_{link}", "type", "rxe", "netdev", link])
    chosen = portals(cluster, trtype)[:paths]
    for portal, ana in zip(chosen, ("optimized", "non-optimized"), strict=False):
        target.add_port(portal)
        target.link(portal.port_id, NQN)
        target.set_ana(portal.port_id, ana)
    for portal in chosen:
        host.connect(portal, NQN, ctrl_loss_tmo=120, keep_alive_tmo=KATO)
    host.wait_paths(NQN, live=paths, timeout=60)
    head = host.head_device(NQN)
    assert head is not None
    return head


@pytest.mark.parametrize("trtype", ["tcp", "rdma"])
def test_a_black_holed_link_between_machines_fails_over_to_the_other(
    cluster: LabCluster, fabrics: tuple[Fabric, Fabric], report: Reporter, trtype: str
) -> None:
    target, host = fabrics
    head = serve(cluster, target, host, trtype, paths=2)
    probe = IoProbe(cluster.vm("gpu-1"), head, seconds=22)
    time.sleep(4)
    cluster.black_hole("gpu-1", "fa")
    try:
        result = probe.result()
    finally:
        cluster.restore("gpu-1", "fa")
    report(f"{trtype}: gpu-1's link A black-holed (KATO {KATO} s), between machines", result.line())
    assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog
    host.wait_paths(NQN, live=2, timeout=90)


def test_a_black_hole_on_the_only_path_stalls_io_for_at_least_the_keep_alive(
    cluster: LabCluster, fabrics: tuple[Fabric, Fabric], report: Reporter
) -> None:
    """The proof that the black hole is real: with one path, I/O cannot go anywhere else while it lasts."""
    target, host = fabrics
    head = serve(cluster, target, host, "tcp", paths=1)
    probe = IoProbe(cluster.vm("gpu-1"), head, seconds=20)
    time.sleep(3)
    cluster.black_hole("gpu-1", "fa")
    time.sleep(KATO + 4)
    cluster.restore("gpu-1", "fa")
    result = probe.result()
    report("tcp: the only path black-holed for 9 s", result.line())
    assert result.max_gap_s >= KATO, "I/O never stalled: the black hole did not cut the path"
    assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog


def test_both_cables_pulled_for_10_s_then_plugged_in_loses_nothing(
    cluster: LabCluster, fabrics: tuple[Fabric, Fabric], report: Reporter
) -> None:
    target, host = fabrics
    head = serve(cluster, target, host, "tcp", paths=2)
    probe = IoProbe(cluster.vm("gpu-1"), head, seconds=24)
    time.sleep(3)

    def outage() -> None:
        for link in ("fa", "fb"):
            cluster.link_down("gpu-1", link)
        time.sleep(10)
        for link in ("fa", "fb"):
            cluster.link_up("gpu-1", link)

    pulled = threading.Thread(target=outage)
    pulled.start()
    pulled.join()
    result = probe.result()
    report("tcp: both of gpu-1's cables pulled for 10 s", result.line())
    assert result.max_gap_s >= 8.0, "I/O never stalled: the cables were not really pulled"
    assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog
    host.wait_paths(NQN, live=2, timeout=90)
