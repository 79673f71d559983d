"""csi-sanity v5.6.0, every spec (controller and node), against ``serve --mode all --backend nvmeof`` in the
lab: a real target agent on real configfs, and the node side staging through the kernel NVMe/TCP initiator
over two portals (one native-multipath head device), with real mkfs, mounts and bind mounts.
JUnit: ``results/csi-sanity-lab-<mode>.xml``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lab.stack import DRIVER_SOCK, GuestDriver
from tests.support.sanity import run_in_lab

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]


@pytest.mark.parametrize("mode", ["mount"])  # block: the node specs over RDMA (test_rdma_lab.py) and the sanity tier
def test_every_spec_on_the_real_fabric(stack: GuestDriver, mode: str, report: Reporter) -> None:
    vm = stack.vm
    result = run_in_lab(
        vm, DRIVER_SOCK, mode, f"csi-sanity-lab-{mode}", report, 2400, extra=("--csi.testnodevolumeattachlimit",)
    )
    assert result.failures == 0 and result.ran >= 55, result
    assert vm.listdir("/sys/kernel/config/nvmet/subsystems") == []
    assert not [d for d in vm.listdir("/sys/class/nvme")], "every controller must be disconnected again"
