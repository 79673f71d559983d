"""NVMe-oF between machines, failing over under a write+verify I/O probe: a planned ANA flip, a black-holed link, a
pulled cable, both cables pulled for 10 s. Each stall is reported; each fault is proved real by what gpu-1 sees
(the path's ANA state, the path leaving ``live``, the I/O stalling for as long as the outage).

- NVMe/TCP on a volume the driver made (``lab/cluster_driver.py``): created, attached, staged and published on
  ``gpu-1`` through CSI, its two paths the node plugin's, the ANA flips the agent's SetAnaState (what
  ``nvmeofctl ana set`` calls).
- NVMe/RDMA over soft-RoCE on the fabric NICs, connected by hand (the cluster's agent has TCP portals only): the
  kernel target on ``storage-1``, the kernel initiator on ``gpu-1``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from lab import Fabric, Portal, ProbeResult
from lab.across import path_of, portals, serve, under_probe
from lab.cluster import LabCluster
from lab.cluster_driver import ClusterDriver
from lab.cluster_driver import portals as agent_portals
from lab.fabric import wait_until
from tests.cluster.driving import OFF, UP, WORK, csi, on

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]
NQN = "nqn.2026-11.io.nvmeof:vol:5c1a2b3d-0000-4000-8000-00000000c001"
KATO = 3
MiB = 1 << 20
#: sets path A's and path B's ANA states (``flip(state_of_a, state_of_b)``)
Flip = Callable[[str, str], None]


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


def test_the_failover_suite_between_machines_loses_no_write_on_a_volume_the_driver_made(
    stack: ClusterDriver, report: Reporter
) -> None:
    params = {"transport": "tcp", "keepAliveTmo": str(KATO)}
    made = csi(stack, "gpu-1", *on("across", *UP, size=128 * MiB, mode="block", params=params))[0]

    def flip(to_a: str, to_b: str) -> None:  # B first when it takes over, so that one path is always optimized
        steps = ["b", to_b, "a", to_a] if to_b == "optimized" else ["a", to_a, "b", to_b]
        stack.agent.ops("ana", *steps)  # the agent's SetAnaState, one guest process for both groups

    try:
        flip("optimized", "non-optimized")  # I/O goes on A until A fails or stops being optimized
        a, b = agent_portals(stack.cluster)
        suite(stack.cluster, "tcp (a driver-made volume)", made["nqn"], f"{WORK}/across/device", (a, b), flip, report)
    finally:
        stack.agent.ops("ana", "a", "optimized", "b", "optimized")
    csi(stack, "gpu-1", *on("across", *OFF, "delete"))


def test_the_failover_suite_between_machines_loses_no_write_over_rdma(
    cluster: LabCluster, fabrics: tuple[Fabric, Fabric], report: Reporter
) -> None:
    target, _ = fabrics
    a, b = portals(cluster, "rdma")
    head = serve(cluster, "gpu-1", NQN, "rdma", kato=KATO)

    def flip(to_a: str, to_b: str) -> None:
        target.set_ana(a.port_id, to_a)
        target.set_ana(b.port_id, to_b)

    suite(cluster, "rdma", NQN, head, (a, b), flip, report)


def suite(
    cluster: LabCluster, label: str, nqn: str, device: str, paths: tuple[Portal, Portal], flip: Flip, report: Reporter
) -> None:
    """The four faults on ``gpu-1``'s two paths to ``nqn`` (A optimized, B not), each under a probe on ``device``:
    0 errors, I/O resumed, and the fault seen by the host."""
    vm, host, (a, _) = cluster.vm("gpu-1"), Fabric(cluster.vm("gpu-1")), paths
    path_a, stalls = path_of(host, nqn, a), {}
    assert wait_until(lambda: path_a() == ("live", "optimized"), 30), path_a()

    def check(fault: str, outcome: tuple[ProbeResult, bool]) -> ProbeResult:
        result, proved = outcome
        report(f"{label} between machines (KATO {KATO} s): {fault}", result.line())
        stalls[fault] = result.max_gap_s
        assert proved, f"{fault}: gpu-1 never saw the fault"
        assert result.errors == 0, (fault, result.errlog)
        assert result.ios_after_last_stall > 0, (fault, "I/O did not resume", result)
        return result

    # 1. Planned failover: A becomes inaccessible and B optimized (what the agent does before maintenance).
    check(
        "ANA flip A->inaccessible, B->optimized",
        under_probe(vm, device, 14, lambda: flip("inaccessible", "optimized"), lambda: path_a()[1] == "inaccessible"),
    )
    flip("optimized", "non-optimized")
    assert wait_until(lambda: path_a()[1] == "optimized", 20), path_a()

    # 2. Link A black-holed (frames vanish, carrier up): only the keep-alive can tell, so I/O on A stalls for it.
    result = check(
        "link A black-holed",
        under_probe(
            vm, device, 17, lambda: cluster.black_hole("gpu-1", "fa"), lambda: path_a()[0] != "live", KATO + 12
        ),
    )
    cluster.restore("gpu-1", "fa")
    assert result.max_gap_s >= KATO - 0.5, "I/O on the optimized path never stalled: the black hole was not real"
    host.wait_paths(nqn, live=2, timeout=90)

    # 3. Cable A pulled (the carrier goes), then plugged in.
    check(
        "cable A pulled",
        under_probe(vm, device, 17, lambda: cluster.link_down("gpu-1", "fa"), lambda: path_a()[0] != "live", KATO + 12),
    )
    cluster.link_up("gpu-1", "fa")
    host.wait_paths(nqn, live=2, timeout=90)

    # 4. Both cables pulled for 10 s: I/O queues, nothing fails, and it resumes when they are plugged in.
    def outage() -> None:
        for link in ("fa", "fb"):
            cluster.link_down("gpu-1", link)
        time.sleep(10)
        for link in ("fa", "fb"):
            cluster.link_up("gpu-1", link)

    pulled = threading.Thread(target=outage)
    result = check("both cables pulled for 10 s", under_probe(vm, device, 24, pulled.start))
    pulled.join()
    assert result.max_gap_s >= 8.0, "I/O never stalled: the cables were not really pulled"
    host.wait_paths(nqn, live=2, timeout=90)
    report(f"{label} between machines: longest stall per fault", ", ".join(f"{k}: {v:.2f}s" for k, v in stalls.items()))
