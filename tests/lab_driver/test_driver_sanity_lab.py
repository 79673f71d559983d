"""csi-sanity v5.4.0, every spec (controller and node), against ``serve --mode all --backend nvmeof`` in the
lab: a real target agent on real configfs, and the node side staging through the kernel NVMe/TCP initiator
over two portals (one native-multipath head device), with real mkfs, mounts and bind mounts.
JUnit: ``results/csi-sanity-lab-<mode>.xml``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from lab import LabVM
from lab.target import FABRIC_MAP, GuestProcess, running_agent
from tests.conftest import RESULTS
from tests.sanity.sanity_runner import read_report, sanity_argv, sanity_binary, summary_lines

pytestmark = pytest.mark.lab
DRIVER_SOCK = "/run/nvmeof-csi/driver.sock"
Reporter = Callable[[str, str], None]


@pytest.fixture(scope="module")
def driver(lab_vm: LabVM) -> Iterator[LabVM]:
    with running_agent(lab_vm):
        driver = GuestProcess(lab_vm, "driver", [
            lab_vm.python, "-m", "nvmeof_csi", "serve", "--mode", "all", "--backend", "nvmeof",
            "--fabric-map", FABRIC_MAP, "--fabric", "lab", "--endpoint", f"unix://{DRIVER_SOCK}",
            "--state-dir", "/scratch/agent/node", "--max-volumes-per-node", "8", "--log-level", "INFO",
        ], DRIVER_SOCK, "/scratch/agent/driver.log")
        driver.start()
        yield lab_vm
        driver.stop()


@pytest.mark.parametrize("mode", ["mount", "block"])
def test_every_spec_on_the_real_fabric(driver: LabVM, mode: str, report: Reporter) -> None:
    vm = driver
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
