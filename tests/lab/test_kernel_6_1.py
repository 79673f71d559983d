"""The lab tier runs on bookworm's own 6.1 kernel (``LAB_KERNEL=6.1`` in ``./dev``): GPU clusters run older
kernels too. The whole driver works there without in-band authentication or TLS, and a StorageClass asking for
DH-HMAC-CHAP or NVMe/TCP TLS is refused up front with FAILED_PRECONDITION naming the missing kernel feature,
instead of a volume no node could ever connect to."""

from __future__ import annotations

import pytest

from lab import Fabric, GuestError, LabVM
from lab.stack import running_stack

pytestmark = pytest.mark.lab
MiB = 1 << 20


def test_driver_basics_and_auth_and_tls_refused_on_6_1(lab_vm: LabVM, fabric: Fabric, kernel_release: str) -> None:
    assert kernel_release.startswith("6.1."), f"the lab tier must run the 6.1 kernel, not {kernel_release}"
    assert not lab_vm.exists("/sys/module/nvme_auth")  # no host authentication either
    with running_stack(lab_vm) as stack:
        up = stack.csi(
            {"op": "up", "name": "old", "size": 64 * MiB, "mode": "mount", "fs": "ext4"},
            {"op": "probe-target", "name": "old", "mib": 4},
        )
        Fabric(lab_vm).wait_paths(up[0]["nqn"], live=2)
        assert any("/old/" in m for m in stack.mounts())
        stack.csi({"op": "down", "name": "old"})
        for mode in ("dhchap", "dhchap-bidirectional"):
            with pytest.raises(GuestError, match=r"FAILED_PRECONDITION.*CONFIG_NVME_TARGET_AUTH") as err:
                stack.one("create", f"auth-{mode}", size=64 * MiB, params={"auth": mode})
            assert "6.1" in str(err.value)  # names the kernel it runs
        with pytest.raises(GuestError, match=r"FAILED_PRECONDITION.*CONFIG_NVME_TARGET_TCP_TLS.*6\.1"):
            stack.one("create", "tls", size=64 * MiB, params={"tls": "psk"})
        assert "tls" not in lab_vm.check(["cat", "/dev/nvme-fabrics"]).strip().split(",")  # the node refuses too
        assert lab_vm.listdir("/sys/kernel/config/nvmet/subsystems") == [], "a refused volume left a subsystem"
        assert lab_vm.listdir("/sys/kernel/config/nvmet/hosts") == [], "the auth probe left a host entry"
