"""One namespace served by the kernel target on ``storage-1`` over two portals of the lab cluster, and faults
applied under a write+verify probe: the shared part of the cluster tier's failover suite and of the benchmark
across machines (``bench/across.py``).

Portal A (port 1 for TCP, 3 for RDMA) listens on ``storage-1``'s ``fa`` address, port 4420, ANA optimized;
portal B (2 or 4) on its ``fb`` address, port 4421, non-optimized: I/O goes on A until A fails or stops being
optimized. The two service ports differ so that one machine talking to itself (the single-VM baseline, over
``lo``) can lose path A alone (:meth:`lab.fabric.Fabric.blackhole` drops by destination port).

Contract: :func:`serve` leaves the initiator connected on every chosen portal with every path live and
returns the multipath head device; :func:`under_probe` returns the probe's result and whether ``proof`` (the
sign that the fault really happened, seen from the initiator) held within its timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lab.cluster import LabCluster
from lab.fabric import Fabric, Portal, wait_until
from lab.probe import IoProbe, ProbeResult
from lab.vm import LabVM

TARGET = "storage-1"
ANA = ("optimized", "non-optimized")


def portals(cluster: LabCluster, trtype: str) -> tuple[Portal, Portal]:
    """Portals A and B of ``trtype`` ("tcp" or "rdma") on ``storage-1``'s two fabric links."""
    base = 1 if trtype == "tcp" else 3
    return (
        Portal(base, trtype, cluster.address(TARGET, "fa"), 4420),
        Portal(base + 1, trtype, cluster.address(TARGET, "fb"), 4421),
    )


def soft_roce(vm: LabVM) -> None:
    """A soft-RoCE device on each of ``vm``'s fabric NICs (idempotent)."""
    shown = vm.check(["rdma", "link", "show"])
    for link in ("fa", "fb"):
        if f"rxe_{link}" not in shown:
            vm.check(["rdma", "link", "add", f"rxe_{link}", "type", "rxe", "netdev", link])


def serve(
    cluster: LabCluster, initiator: str, nqn: str, trtype: str, paths: int = 2, kato: int = 5, ana: bool = True
) -> str:
    """``nqn`` (already a subsystem on ``storage-1``) on the first ``paths`` portals of ``trtype``, connected
    from ``initiator`` (``storage-1`` itself for the one-machine baseline) with keep-alive ``kato``; with
    ``ana`` A is optimized and B non-optimized. Returns the head device."""
    target, host = Fabric(cluster.vm(TARGET)), Fabric(cluster.vm(initiator))
    if trtype == "rdma":
        for name in {TARGET, initiator}:
            soft_roce(cluster.vm(name))
    chosen = portals(cluster, trtype)[:paths]
    for portal, state in zip(chosen, ANA, strict=False):
        target.add_port(portal)
        target.link(portal.port_id, nqn)
        target.set_ana(portal.port_id, state if ana else "optimized")
    for portal in chosen:
        host.connect(portal, nqn, ctrl_loss_tmo=120, keep_alive_tmo=kato)
    host.wait_paths(nqn, live=paths, timeout=60)
    head = host.head_device(nqn)
    if head is None:
        raise AssertionError(f"{initiator}: no multipath head device for {nqn}")
    return head


def path_of(host: Fabric, nqn: str, portal: Portal) -> Callable[[], tuple[str, str]]:
    """A reader of ``(controller state, ANA state)`` of the initiator's path through ``portal`` (``("gone",
    "")`` while it has none)."""
    needle = f"traddr={portal.traddr},trsvcid={portal.trsvcid}"

    def read() -> tuple[str, str]:
        for path in host.paths(nqn):
            if needle in path.address:
                return path.state, path.ana_state
        return "gone", ""

    return read


def under_probe(
    vm: LabVM,
    head: str,
    seconds: float,
    fault: Callable[[], None],
    proof: Callable[[], bool] = lambda: True,
    proof_timeout: float = 20.0,
    lead: float = 3.0,
    timeline_ms: float = 0.0,
) -> tuple[ProbeResult, bool]:
    """A write+verify probe on ``head`` of at most ``seconds`` with ``fault`` applied after ``lead`` seconds,
    stopped once ``proof`` holds (it ends when its I/O has flowed again for a few seconds); the fault's undo is
    the caller's, after this returns."""
    probe = IoProbe(vm, head, seconds=seconds, timeline_ms=timeline_ms)
    time.sleep(lead)
    fault()
    proved = wait_until(proof, proof_timeout, interval=0.25)
    return probe.stop(), proved
