"""``tlshd`` started in a lab guest for its NVMe/TCP TLS volumes (the binary: :mod:`image.tlshd`).

Contract: :func:`start_tlshd` starts one daemon in a guest (configured to link the ``.nvme`` keyring; with the
chart's capabilities only, :data:`image.tlshd.CAPABILITIES`, so the lab's TLS volumes prove them enough) and
returns once the process runs, loading the kernel's TLS and AES-GCM modules first; ``BuildError`` when it does
not start.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from image.tlshd import CAPABILITIES, CONF_TEXT
from lab.build import BuildError
from lab.vm import LabVM

CONF = "/run/nvmeof-csi/tlshd.conf"
LOG = "/run/nvmeof-csi/tlshd.log"


def start_tlshd(vm: LabVM, daemon: Path, timeout: float = 30) -> None:
    """One ``tlshd`` in ``vm`` (idempotent), with the kernel's TLS and AES-GCM modules loaded."""
    for module in ("tls", "gcm", "ghash-generic"):
        vm.check(["modprobe", module], timeout=30)
    vm.run(["modprobe", "aesni-intel"], 30)  # faster AES where the (emulated) CPU has it; optional
    if vm.run(["pidof", "tlshd"], 10).rc == 0:
        return
    vm.check(["mkdir", "-p", os.path.dirname(CONF)], timeout=10)
    vm.write(CONF, CONF_TEXT)
    # as the chart runs it: uid 0 with every capability dropped but CAPABILITIES, no new privileges
    keep = ",".join(f"+{cap.lower()}" for cap in CAPABILITIES)
    confined = f"setpriv --no-new-privs --inh-caps=-all --bounding-set=-all,{keep} --"
    vm.check(["sh", "-c", f"setsid {confined} {daemon} -c {CONF} -s </dev/null >{LOG} 2>&1 &"], timeout=30)
    deadline = time.monotonic() + timeout
    while vm.run(["pidof", "tlshd"], 10).rc != 0:
        if time.monotonic() > deadline:
            raise BuildError(f"tlshd did not start in the guest: {vm.run(['cat', LOG], 10).out[-400:]}")
        time.sleep(0.5)
