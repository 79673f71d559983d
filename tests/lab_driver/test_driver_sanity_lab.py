"""csi-sanity v5.4.0, every spec (controller and node), against ``serve --mode all --backend nvmeof`` in the
lab: a real target agent on real configfs, and the node side staging through the kernel NVMe/TCP initiator
over two portals (one native-multipath head device), with real mkfs, mounts and bind mounts.
JUnit: ``results/csi-sanity-lab-<mode>.xml``."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lab.stack import DRIVER_SOCK, GuestDriver
from tests.support.env import RESULTS
from tests.support.sanity import read_report, sanity_argv, sanity_binary, summary_lines

pytestmark = pytest.mark.lab
Reporter = Callable[[str, str], None]


@pytest.mark.parametrize("mode", ["mount", "block"])
def test_every_spec_on_the_real_fabric(stack: GuestDriver, mode: str, report: Reporter) -> None:
    vm = stack.vm
    guest_report = f"/tmp/csi-sanity-all-{mode}.xml"
    vm.mkdir(f"/tmp/sanity-all-{mode}")
    argv = sanity_argv(sanity_binary(), DRIVER_SOCK, f"/tmp/sanity-all-{mode}", mode, guest_report, size=64 << 20,
                       extra=("--csi.testnodevolumeattachlimit",))
    start = time.monotonic()
    res = vm.run(argv, timeout=2400)
    report(f"csi-sanity lab ({mode})", f"{summary_lines(res.out)} [{time.monotonic() - start:.0f}s]")
    RESULTS.mkdir(exist_ok=True)
    xml = vm.read(guest_report)
    (RESULTS / f"csi-sanity-lab-{mode}.xml").write_text(xml)
    assert res.rc == 0, res.out[-8000:]
    result = read_report(xml)
    assert result.failures == 0 and result.ran >= 55, result
    assert vm.listdir("/sys/kernel/config/nvmet/subsystems") == []
    assert not [d for d in vm.listdir("/sys/class/nvme")], "every controller must be disconnected again"
