"""Is a block device in use on this host? Used before anything is disconnected without a caller asking.

Contract: :func:`device_in_use` returns a reason (``"mounted at /x"``, ``"held by dm-0"``, ``"open"``) or ``""``
when nothing uses the device; it never raises for a device that vanished (then it is not in use). It reads
``/proc/self/mountinfo`` (by major:minor), the device's ``holders`` in sysfs, and tries an exclusive open
(``O_EXCL`` fails with EBUSY while anyone has the device mounted or exclusively open).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def device_in_use(device: str, sys_root: Path = Path("/sys"), mountinfo: Path = Path("/proc/self/mountinfo")) -> str:
    name = Path(device).name
    try:
        majmin = (sys_root / "class" / "block" / name / "dev").read_text().strip()
    except OSError:
        return ""
    try:
        for line in mountinfo.read_text().splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[2] == majmin:
                return f"mounted at {fields[4]}"
    except OSError:
        pass
    try:
        holders = sorted(p.name for p in (sys_root / "class" / "block" / name / "holders").iterdir())
    except OSError:
        holders = []
    if holders:
        return f"held by {', '.join(holders)}"
    try:
        fd = os.open(device, os.O_RDONLY | os.O_EXCL | os.O_NONBLOCK)
    except OSError as exc:
        return "open" if exc.errno == errno.EBUSY else ""
    os.close(fd)
    return ""


def device_number(device: str) -> str:
    """``/dev/nvme0n1`` -> ``259:0`` (the device number the kernel's io.max lines use); ``OSError`` when the
    device is not there."""
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"
