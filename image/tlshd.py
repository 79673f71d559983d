"""``tlshd``, the kernel's TLS handshake daemon (ktls-utils): the binary, fetched into the machine-wide cache for
the driver image and the lab.

Debian 12 has no ktls-utils; Debian 13 (trixie) does. Its source package cannot be fetched here (the archive
answers 404 for ``ktls-utils_1.0.0-1.dsc`` and its tarballs, while other source packages come), so this takes
the trixie binary package of the pinned version (``KTLS_UTILS_VERSION`` in ``versions.env``) through a private apt
configuration (:func:`image.apt.apt_options`: nothing of the host's apt setup changes) and unpacks it into the
machine-wide cache. Its ``tlshd`` needs no newer symbol than GNUTLS_3_7_3 and GLIBC_2.34, so it runs on bookworm's
gnutls, glib, keyutils and libnl (checked by running ``tlshd --help`` once unpacked). The lab VMs see the host's
root, so the same file serves them (``lab/tlshd.py`` starts it in a guest).

Contract: :func:`ensure_tlshd` is idempotent and returns the daemon's path, or raises ``ToolError`` naming the
step that failed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from image.apt import ToolError, apt_options
from image.machine_cache import lab_cache, machine_cache

SUITE = "trixie"
CONF_TEXT = (
    "[debug]\nloglevel=2\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n[authenticate.client]\n[authenticate.server]\n"
)
#: the only capabilities tlshd runs with, in the lab and in the chart (``deploy/chart_policy.py``)
CAPABILITIES = ("NET_ADMIN",)
VERSIONS = Path(__file__).resolve().parent.parent / "versions.env"


def version(versions: Path = VERSIONS) -> str:
    for line in versions.read_text().splitlines():
        if line.startswith("KTLS_UTILS_VERSION="):
            return line.split("=", 1)[1].split()[0]
    raise ToolError("versions.env has no KTLS_UTILS_VERSION")


def _run(argv: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd, check=False)
    if proc.returncode:
        raise ToolError(f"{' '.join(argv[:2])} ... failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-400:]}")
    return proc.stdout


def ensure_tlshd(cache: Path | None = None) -> Path:
    """The cached ``tlshd`` of the pinned ktls-utils, fetched and unpacked when missing."""
    want = version()
    root = (cache or machine_cache() / "tools") / f"ktls-utils-{want}"
    daemon = root / "usr" / "sbin" / "tlshd"
    if daemon.exists():
        return daemon
    apt = apt_options(SUITE, lab_cache())
    downloads = root.with_name(root.name + ".dl")
    downloads.mkdir(parents=True, exist_ok=True)
    try:
        _run(["apt-get", *apt, "download", f"ktls-utils={want}"], cwd=downloads)
    except ToolError:
        _run(["apt-get", *apt, "update", "-qq"])  # package lists missing or stale
        _run(["apt-get", *apt, "download", f"ktls-utils={want}"], cwd=downloads)
    debs = sorted(downloads.glob("ktls-utils_*.deb"))
    if not debs:
        raise ToolError(f"apt-get download ktls-utils={want} left no .deb in {downloads}")
    staging = root.with_name(root.name + ".tmp")
    _run(["rm", "-rf", str(staging)])
    _run(["dpkg-deb", "-x", str(debs[-1]), str(staging)])
    _run([str(staging / "usr" / "sbin" / "tlshd"), "--help"])  # runs on this system's libraries (rc 0 on usage)
    os.replace(staging, root)
    _run(["rm", "-rf", str(downloads)])
    return daemon
