"""The container image (``./dev image``: debootstrap + umoci, no registry) run by runc inside the lab VM: the
driver, the admin CLI and the TLS handshake daemon start from it. It is unpacked on this host once per image (``image.build.unpacked``)
and its root file system read, read-only, over the VM's host share. Its size is reported."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from image.base import PREFIX, PYTHON, stale_bytecode
from image.build import ImageError, current, unpacked
from lab import LabVM
from tests.support.env import need

pytestmark = pytest.mark.lab
BUNDLE = "/run/nvmeof-image-bundle"


def run_in_image(vm: LabVM, argv: list[str], name: str) -> str:
    """``argv`` as the process of a runc container of the unpacked image; its output."""
    config = json.loads(vm.read(f"{BUNDLE}/config.json"))
    config["process"].update(args=argv, terminal=False)
    vm.check(
        ["python3", "-c", f"import sys; open({BUNDLE + '/config.json'!r}, 'w').write(sys.argv[1])", json.dumps(config)],
        timeout=30,
    )
    res = vm.run(["runc", "run", "--bundle", BUNDLE, name], 300)
    assert res.rc == 0, f"{argv} in the image: rc={res.rc}\n{res.out}{res.err}"
    return res.out


def test_image_runs_the_driver_and_the_cli(lab_vm: LabVM, report: Callable[[str, str], None]) -> None:
    try:
        info = current()
    except ImageError as err:
        need(False, str(err))
        return
    rootfs = unpacked(info) / "rootfs"  # on this host, once per image; the VM reads it over its host share
    config = json.loads((rootfs.parent / "config.json").read_text())
    config["root"] = {"path": str(rootfs), "readonly": True}
    lab_vm.run(["rm", "-rf", BUNDLE], 60)
    lab_vm.mkdir(BUNDLE)
    lab_vm.write(f"{BUNDLE}/config.json", json.dumps(config))
    version = run_in_image(lab_vm, ["/usr/local/bin/nvmeof-csi", "--version"], "version")
    assert version.strip() == f"csi.nvmeof.io {info['tag']}"
    cli = run_in_image(lab_vm, ["/usr/local/bin/nvmeofctl", "--help"], "cli")
    assert "volumes" in cli and "Usage" in cli
    tools = run_in_image(
        lab_vm, ["/bin/sh", "-c", "nvme version && mkfs.xfs -V && mkfs.ext4 -V 2>&1 | head -1"], "tools"
    )
    assert "nvme version" in tools and "mkfs.xfs version" in tools
    tlshd = run_in_image(
        lab_vm, ["/bin/sh", "-c", "/usr/sbin/tlshd --help 2>&1; grep keyrings /etc/tlshd.conf"], "tlshd"
    )
    assert "usage: tlshd" in tlshd and "keyrings=.nvme" in tlshd  # NVMe/TCP TLS handshakes, on the image's libraries
    unpacked_mib = subprocess.run(
        ["du", "-sm", str(rootfs)], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()[0]
    # the root is read-only in every pod: a module without valid bytecode is compiled at each start (501 of them,
    # pip's, were before the build wrote unchecked-hash bytecode; the controller took 94 s to serve under TCG)
    stale = stale_bytecode(rootfs / PREFIX.lstrip("/") / "lib" / f"python{PYTHON}" / "site-packages")
    assert not stale, f"{len(stale)} modules would be compiled at every start, e.g. {stale[:5]}"
    report(
        "image size",
        f"{info['size_mib']} MiB compressed (OCI layers), {unpacked_mib} MiB unpacked; {info['layout']}:{info['tag']}",
    )
    lab_vm.run(["rm", "-rf", BUNDLE], 60)
