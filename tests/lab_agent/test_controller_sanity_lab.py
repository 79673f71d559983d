"""csi-sanity v5.6.0, every controller spec of the advertised capabilities (create/delete, publish/unpublish,
list with pagination, GetCapacity, expansion, snapshots, list snapshots, clones), against
``serve --mode controller --backend nvmeof`` talking to a real target agent on real configfs in the lab.
A node plugin answers NodeGetInfo with the guest's host NQN (node specs belong to the node tier).
JUnit: ``results/csi-sanity-lab-controller-<mode>.xml``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lab import LabVM
from lab.stack import KUBELET_ROOT
from lab.target import FABRIC_MAP, GuestProcess, running_agent
from tests.support.sanity import run_in_lab

pytestmark = pytest.mark.lab
CTRL_SOCK = "/run/nvmeof-csi/controller.sock"
NODE_SOCK = "/run/nvmeof-csi/node.sock"
Reporter = Callable[[str, str], None]


@pytest.fixture(scope="module")
def controller_stack(lab_vm: LabVM) -> Iterator[LabVM]:
    with running_agent(lab_vm):
        controller = GuestProcess(
            lab_vm,
            "controller",
            [
                lab_vm.python,
                "-m",
                "nvmeof_csi",
                "serve",
                "--mode",
                "controller",
                "--backend",
                "nvmeof",
                "--fabric-map",
                FABRIC_MAP,
                "--endpoint",
                f"unix://{CTRL_SOCK}",
                "--log-level",
                "WARNING",
            ],
            CTRL_SOCK,
            "/scratch/agent/controller.log",
        )
        node = GuestProcess(
            lab_vm,
            "node",
            [
                lab_vm.python,
                "-m",
                "nvmeof_csi",
                "serve",
                "--mode",
                "node",
                "--backend",
                "loop",
                "--fabric",
                "lab",
                "--node-id",
                lab_vm.hostnqn,
                "--endpoint",
                f"unix://{NODE_SOCK}",
                "--state-dir",
                "/tmp/node-state",
                "--kubelet-root",
                KUBELET_ROOT,
                "--log-level",
                "WARNING",
            ],
            NODE_SOCK,
            "/scratch/agent/node.log",
        )
        controller.start()
        node.start()
        yield lab_vm
        node.stop()
        controller.stop()


@pytest.mark.parametrize("mode", ["mount"])  # block differs only in the capability: the sanity tier runs both
def test_controller_specs_on_real_configfs(controller_stack: LabVM, mode: str, report: Reporter) -> None:
    vm = controller_stack
    result = run_in_lab(
        vm,
        NODE_SOCK,
        mode,
        f"csi-sanity-lab-controller-{mode}",
        report,
        1500,
        controller_endpoint=CTRL_SOCK,
        extra=("--ginkgo.skip=Node Service",),
    )
    assert result.failures == 0 and result.ran >= 50, result
    assert vm.listdir("/sys/kernel/config/nvmet/subsystems") == [], "csi-sanity cleaned up; configfs must be empty"
