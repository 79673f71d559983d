"""A replicated volume's DRBD resource (``agent/drbd_config.py``), read back by the real ``drbdadm-84`` of Debian's
drbd-utils (``dump``): it parses, and every value the agent meant is in it; a hostile value never reaches the
file. The kernel applying it is the lab's part."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nvmeof_csi.agent.drbd_config import DrbdSide, resource_name, resource_text
from nvmeof_csi.errors import InvalidArgument
from tests.support.env import need

DRBDADM = Path("/usr/lib/drbd/drbdadm-84")
VOL = "0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01"
SECRET = "0123456789abcdef0123456789abcdef"
SIDES = (DrbdSide("storage-1", "169.254.11.1", 7100, "/dev/loop5"), DrbdSide("storage-2", "169.254.11.2", 7100,
                                                                                "/dev/loop7"))  # fmt: skip
HANDLERS = ("/opt/nvmeof-csi/bin/fence-peer", "/opt/nvmeof-csi/bin/after-resync")


def dump(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "r.res"
    conf.write_text(text)
    return subprocess.run([str(DRBDADM), "-c", str(conf), "dump", "all"], capture_output=True, text=True, timeout=30)


def test_drbdadm_reads_the_resource_as_the_agent_meant_it(tmp_path: Path) -> None:
    need(DRBDADM.exists(), "drbd-utils (drbdadm-84) is not installed")
    text = resource_text(VOL, 100, SIDES, SECRET, *HANDLERS)
    out = dump(tmp_path, text)
    assert out.returncode == 0, out.stderr
    flat = " ".join(out.stdout.split())
    for needle in (f"resource {resource_name(VOL)}", "protocol C;", "fencing resource-and-stonith;",
                   "after-sb-1pri disconnect;", f"fence-peer {HANDLERS[0]};", "on storage-1 {",
                   "address ipv4 169.254.11.1:7100;", "disk /dev/loop7;", "device /dev/drbd100 minor 100;",
                   "meta-disk internal;"):  # fmt: skip
        assert needle in flat, (needle, out.stdout)
    broken = dump(tmp_path, text.replace("disk {", "disc {"))
    assert broken.returncode != 0 and "Parse error" in broken.stderr  # the check can fail


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"minor": -1}, "minor -1"),
        ({"secret": 'x"; } handlers { split-brain "/bin/sh'}, "32-64 lowercase hex"),
        ({"fence_peer": "fence; reboot"}, "must be an absolute path"),
        ({"sides": (SIDES[0], DrbdSide("storage-1", "169.254.11.2", 7100, "/dev/loop7"))}, "two nodes"),
        ({"sides": (SIDES[0], DrbdSide("storage-2 {", "169.254.11.2", 7100, "/dev/loop7"))}, "second host"),
        ({"sides": (SIDES[0], DrbdSide("storage-2", "storage-2.lab", 7100, "/dev/loop7"))}, "IP address"),
        ({"sides": (SIDES[0], DrbdSide("storage-2", "169.254.11.2", 0, "/dev/loop7"))}, "port 0"),
        ({"sides": (SIDES[0], DrbdSide("storage-2", "169.254.11.2", 7100, "/dev/../etc/x"))}, "under /dev"),
    ],
)
def test_hostile_values_never_reach_the_file(change: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"vol_uuid": VOL, "minor": 100, "sides": SIDES, "secret": SECRET,
                               "fence_peer": HANDLERS[0], "after_resync": HANDLERS[1], **change}  # fmt: skip
    with pytest.raises(InvalidArgument, match=needle):
        resource_text(**args)  # type: ignore[arg-type]
