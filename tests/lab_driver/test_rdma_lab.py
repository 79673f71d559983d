"""NVMe/RDMA through the driver: a ``transport: rdma`` StorageClass end to end in the lab over two soft-RoCE
portals (each on its own dummy netdev and rxe device inside the VM): csi-sanity's node specs, and the failover
suite (ANA flip, portal removal, both paths down; a black-holed path cannot be made over soft-RoCE on one host)
on a published volume with 0 verify errors. A volume uses one transport: its paths are the agent's portals of that transport only."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lab import Fabric
from lab.stack import DRIVER_SOCK, GuestDriver
from lab.target import TWO_RDMA_PORTALS
from tests.lab_driver.test_node_lab import assert_all_released, failover_suite
from tests.support.env import ROOT
from tests.support.sanity import run_in_lab

pytestmark = pytest.mark.lab
MiB = 1 << 20
R1, R2 = TWO_RDMA_PORTALS
Reporter = Callable[[str, str], None]


def test_failover_suite_over_rdma(stack: GuestDriver, report: Reporter) -> None:
    fabric = Fabric(stack.vm)
    steps = stack.csi(
        {"op": "up", "name": "rd", "size": 256 * MiB, "mode": "mount", "fs": "ext4", "params": {"transport": "rdma"}},
        {"op": "probe-target", "name": "rd", "mib": 16},
    )
    nqn = steps[0]["nqn"]
    assert steps[0]["portals"] == f"rdma:{R1.traddr}:{R1.trsvcid},rdma:{R2.traddr}:{R2.trsvcid}"
    paths = fabric.wait_paths(nqn, live=2)
    assert sorted(p.transport for p in paths) == ["rdma", "rdma"], paths
    # no black-holed path here: soft-RoCE delivers packets between two local addresses inside rxe itself
    # (RXE_LOOPBACK_MASK: the destination MAC is the device's own), so no qdisc or netfilter rule ever sees them
    failover_suite(stack, nqn, steps[1]["path"], (R1, R2), None, report, "rdma volume", "rd")
    stack.csi({"op": "down", "name": "rd"})
    assert_all_released(stack, nqn)


def test_csi_sanity_node_specs_over_rdma(stack: GuestDriver, report: Reporter) -> None:
    vm = stack.vm
    result = run_in_lab(
        vm,
        DRIVER_SOCK,
        "mount",
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
