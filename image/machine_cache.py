"""The machine-wide build cache (lab kernels, the image, the Kubernetes tier's binaries, Go tools), shared by
every clone on the machine and keyed by version inside. One rule, here: ``$NVMEOF_CSI_CACHE`` when set, else
``/var/cache/nvmeof-csi`` for root and ``~/.cache/nvmeof-csi`` for anyone else. ``./dev`` exports
``NVMEOF_CSI_CACHE`` by the same rule, so its tools and these modules agree. The lab's part of it is
``$LAB_CACHE`` when set, else ``lab/`` inside it."""

from __future__ import annotations

import os
from pathlib import Path


def machine_cache() -> Path:
    """The machine-wide cache folder (not created here)."""
    chosen = os.environ.get("NVMEOF_CSI_CACHE")
    if chosen:
        return Path(chosen)
    return Path("/var/cache/nvmeof-csi") if os.geteuid() == 0 else Path.home() / ".cache" / "nvmeof-csi"


def lab_cache() -> Path:
    """The lab's cache folder (kernels, node disks, apt lists of other suites); not created here."""
    return Path(os.environ.get("LAB_CACHE") or machine_cache() / "lab")
