"""NVMe/RDMA through the driver: a ``transport: rdma`` StorageClass end to end in the lab over two soft-RoCE
portals (each on its own dummy netdev and rxe device inside the VM): csi-sanity's node specs on raw block volumes,
and a published volume whose paths are the agent's RDMA portals only, moving its I/O when the agent flips the
optimized group (0 verify errors). The rest of the failover suite over RDMA (a black-holed link, a pulled cable, both cables
pulled) runs between machines in the cluster tier (``tests/cluster/test_fabric_across.py``), where soft-RoCE
crosses real links; on one host it loops back inside rxe, below any fault a test can make."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lab import Fabric
from lab.stack import DRIVER_SOCK, GuestDriver
from lab.target import TWO_RDMA_PORTALS
from tests.lab_driver.test_node_lab import _under_probe, assert_all_released
from tests.support.env import ROOT
from tests.support.sanity import run_in_lab

pytestmark = pytest.mark.lab
MiB = 1 << 20
R1, R2 = TWO_RDMA_PORTALS
Reporter = Callable[[str, str], None]


def test_a_published_rdma_volume_moves_its_io_on_an_ana_flip(stack: GuestDriver, report: Reporter) -> None:
    fabric = Fabric(stack.vm)
    steps = stack.csi(
        {"op": "up", "name": "rd", "size": 256 * MiB, "mode": "mount", "fs": "ext4", "params": {"transport": "rdma"}},
        {"op": "probe-target", "name": "rd", "mib": 16},
    )
    nqn = steps[0]["nqn"]
    assert steps[0]["portals"] == f"rdma:{R1.traddr}:{R1.trsvcid},rdma:{R2.traddr}:{R2.trsvcid}"
    paths = fabric.wait_paths(nqn, live=2)
    assert sorted(p.transport for p in paths) == ["rdma", "rdma"], paths
    result = _under_probe(stack, steps[1]["path"], 9, lambda: stack.agent.ctl("ana", "set", "a", "inaccessible"))
    stack.agent.ctl("ana", "set", "a", "optimized")
    report("rdma volume: ANA group a optimized->inaccessible", result.line())
    assert result.errors == 0 and result.ios_after_last_stall > 0, result.errlog
    stack.csi({"op": "down", "name": "rd"})
    assert_all_released(stack, nqn)


def test_csi_sanity_node_specs_over_rdma(stack: GuestDriver, report: Reporter) -> None:
    vm = stack.vm
    result = run_in_lab(
        vm,
        DRIVER_SOCK,
        "block",  # raw block on the real fabric (every spec in mount mode: test_driver_sanity_lab.py)
        "csi-sanity-lab-rdma-node",
        report,
        1800,
        extra=(
            f"--csi.testvolumeparameters={ROOT / 'tests' / 'support' / 'sanity-rdma.yaml'}",
            "--ginkgo.focus=Node Service",
        ),
    )
    assert result.failures == 0 and result.ran >= 10, result
    assert vm.listdir("/sys/kernel/config/nvmet/subsystems") == []
    assert not vm.listdir("/sys/class/nvme"), "every controller must be disconnected again"
