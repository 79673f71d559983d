"""``nvmeofctl doctor`` on the lab node (kernel 6.1), with native multipath on and then really off: every NVMe
module unloaded (the target's too: nvmet's passthru support holds nvme_core) and nvme_core loaded again with
``multipath=N``; doctor must then fail exactly that check, with its fix (and the multipath feature too once it is
required), and pass again once restored. Every StorageClass feature is listed: dhchap absent on 6.1."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from lab import Fabric, LabVM
from lab.build import REPO

pytestmark = pytest.mark.lab
UNLOAD = ["modprobe", "-r", "nvmet_rdma", "nvmet_tcp", "nvmet", "nvme_rdma", "nvme_tcp", "nvme_fabrics", "nvme_core"]


def doctor(vm: LabVM, rc: int, *extra: str) -> dict[str, dict[str, str]]:
    res = vm.run([vm.python, "-m", "nvmeof_csi.cli.main", "-o", "json", "doctor", *extra], 120, cwd=str(REPO))
    assert res.rc == rc, (res.rc, res.out[-3000:], res.err[-2000:])
    return {row["name"]: row for row in json.loads(res.out)}


def test_doctor_fails_with_native_multipath_off(
    lab_vm: LabVM, fabric: Fabric, report: Callable[[str, str], None]
) -> None:
    host_id = str(uuid.uuid4())  # what the node plugin writes on a fresh node
    lab_vm.mkdir("/etc/nvme")
    lab_vm.write("/etc/nvme/hostid", host_id + "\n")
    lab_vm.write("/etc/nvme/hostnqn", f"nqn.2014-08.org.nvmexpress:uuid:{host_id}\n")
    before = doctor(lab_vm, 0, "--feature", "tcp", "--feature", "multipath")
    assert {r["result"] for r in before.values()} <= {"pass", "absent"}, before
    assert before["feature tcp"]["result"] == before["feature multipath"]["result"] == "pass"
    assert before["feature dhchap"]["result"] == "absent", before  # Debian's 6.1 has no NVMe host authentication
    assert "CONFIG_NVME_HOST_AUTH" in before["feature dhchap"]["detail"]
    try:
        lab_vm.check(UNLOAD, timeout=120)
        for argv in (["modprobe", "nvme_core", "multipath=N"], ["modprobe", "nvme_tcp"], ["modprobe", "nvme_rdma"]):
            lab_vm.check(argv, timeout=60)
        off = doctor(lab_vm, 1)
        failed = {name: row for name, row in off.items() if row["result"] == "FAIL"}
        report("nvmeofctl doctor with multipath off", json.dumps(failed))
        assert list(failed) == ["native multipath"], failed
        assert off["feature multipath"]["result"] == "absent"  # no StorageClass asked for it here
        required = doctor(lab_vm, 1, "--feature", "multipath")
        assert [n for n, row in required.items() if row["result"] == "FAIL"] == [
            "feature multipath",
            "native multipath",
        ]
        assert "nvme_core.multipath=Y" in required["feature multipath"]["fix"]
        assert "nvme_core.multipath=N" in failed["native multipath"]["detail"]
        assert "multipath=Y" in failed["native multipath"]["fix"]
    finally:
        lab_vm.run(UNLOAD, 120)
        fabric.load(rdma=True)
    assert fabric.multipath_enabled()
    assert "FAIL" not in {r["result"] for r in doctor(lab_vm, 0, "--feature", "multipath").values()}
