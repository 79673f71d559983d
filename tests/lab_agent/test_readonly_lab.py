"""Read-only enforced by the target, on the real kernel: a host granted read-only reaches the volume only through
its read-only subsystem, whose namespace refuses every write (``agent/readonly.py``), and still sees what the
writer writes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lab import Fabric, LabVM
from lab.target import POOL_DIR, GuestTargetAgent
from tests.lab_agent.conftest import P1, P2

pytestmark = pytest.mark.lab
MiB = 1 << 20
READER_ID = "0e0e0e0e-1111-2222-3333-444444444444"
READER = f"nqn.2014-08.org.nvmexpress:uuid:{READER_ID}"
AS_READER = [f"--hostnqn={READER}", f"--hostid={READER_ID}"]  # one kernel, two hosts: a host ID each
Reporter = Callable[[str, str], None]


def _sha(vm: LabVM, path: str) -> str:
    return vm.check(["sha256sum", path]).split()[0]


def write_refused(vm: LabVM, fabric: Fabric, ro_nqn: str) -> bool:
    """Connect as :data:`READER` to ``ro_nqn`` and try one O_DIRECT block write: True when it failed."""
    fabric.connect(P1, ro_nqn, extra=AS_READER)
    reader = fabric.wait_head(ro_nqn)
    vm.check(["dd", "if=/dev/urandom", "of=/scratch/ro-junk", "bs=4096", "count=1"])
    return vm.run(["dd", "if=/scratch/ro-junk", f"of={reader}", "bs=4096", "oflag=direct"], timeout=60).rc != 0


def test_a_read_only_host_cannot_change_a_byte_and_sees_the_writer(
    lab_vm: LabVM, fabric: Fabric, agent: GuestTargetAgent, report: Reporter
) -> None:
    vol = agent.ops("create", "pvc-ro", str(32 * MiB), lab_vm.hostnqn)  # the VM's own host NQN writes
    nqn, backing = vol["nqn"], f"{POOL_DIR}/volumes/{vol['uuid']}.img"
    fabric.connect(P1, nqn)
    writer = fabric.wait_head(nqn)
    lab_vm.check(["dd", "if=/dev/urandom", "of=/scratch/ro-a", "bs=1M", "count=4"])
    lab_vm.check(["dd", "if=/scratch/ro-a", f"of={writer}", "bs=1M", "oflag=direct"])
    agent.ops("allow", vol["uuid"], READER, "ro")

    connect = ["nvme", "connect", "-t", "tcp", "-a", P1.traddr, "-s", str(P1.trsvcid), *AS_READER]
    refused = lab_vm.run([*connect, "-n", nqn], timeout=60)
    assert refused.rc != 0, "a read-only host must not be allowed on the volume's own subsystem"
    ro_nqn = nqn + ":ro"
    fabric.connect(P1, ro_nqn, extra=AS_READER)
    fabric.connect(P2, ro_nqn, extra=AS_READER)
    reader = fabric.wait_head(ro_nqn)
    before = _sha(lab_vm, backing)

    lab_vm.check(["dd", "if=/dev/urandom", "of=/scratch/ro-junk", "bs=4096", "count=1"])
    raw = lab_vm.run(
        ["nvme", "write", reader, "--start-block=0", "--block-count=7", "--data-size=4096", "--data=/scratch/ro-junk"],
        timeout=60,
    )
    direct = lab_vm.run(["dd", "if=/scratch/ro-junk", f"of={reader}", "bs=4096", "seek=3", "oflag=direct"], timeout=60)
    report("read-only host: nvme write", f"rc {raw.rc}: {(raw.err or raw.out).strip()[:80]}")
    assert raw.rc != 0 and direct.rc != 0
    assert _sha(lab_vm, backing) == before, "a read-only host changed the volume"

    lab_vm.check(["dd", "if=/dev/urandom", "of=/scratch/ro-b", "bs=1M", "count=1"])
    lab_vm.check(["dd", "if=/scratch/ro-b", f"of={writer}", "bs=1M", "seek=8", "oflag=direct"])
    seen = lab_vm.check(["sh", "-c", f"dd if={reader} bs=1M skip=8 count=1 iflag=direct status=none | sha256sum"])
    assert seen.split()[0] == _sha(lab_vm, "/scratch/ro-b"), "the read-only host must see the writer's data"

    fabric.disconnect_all()  # restart and reboot: tests/lab_agent/test_agent_lab.py
    agent.ops("deny", vol["uuid"], READER)
    assert ro_nqn not in agent.ops("dump")["subsystems"]
