"""``tlshd``, the kernel's TLS handshake daemon (ktls-utils), for the lab's NVMe/TCP TLS volumes.

Debian 12 has no ktls-utils; Debian 13 (trixie) does. Its source package cannot be fetched here (the archive
answers 404 for ``ktls-utils_1.0.0-1.dsc`` and its tarballs, while other source packages come), so the lab takes
the trixie binary package of the pinned version (``KTLS_UTILS_VERSION`` in ``versions.env``) through a private apt
configuration (:func:`lab.build.apt_options`: nothing of the host's apt setup changes) and unpacks it into the
machine-wide cache. Its ``tlshd`` needs no newer symbol than GNUTLS_3_7_3 and GLIBC_2.34, so it runs on bookworm's
gnutls, glib, keyutils and libnl (checked by running ``tlshd --help`` once unpacked). The lab VMs see the host's
root, so the same file serves them.

Contract: :func:`ensure_tlshd` is idempotent and returns the daemon's path, or raises ``BuildError`` naming the
step that failed; :func:`start_tlshd` starts one daemon in a guest (configured to link the ``.nvme`` keyring) and
returns once the process runs, loading the kernel's TLS and AES-GCM modules first.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from lab.build import CACHE, BuildError, apt_options
from lab.machine_cache import machine_cache
from lab.vm import LabVM

SUITE = "trixie"
CONF = "/run/nvmeof-csi/tlshd.conf"
LOG = "/run/nvmeof-csi/tlshd.log"
CONF_TEXT = (
    "[debug]\nloglevel=2\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n[authenticate.client]\n[authenticate.server]\n"
)
VERSIONS = Path(__file__).resolve().parent.parent / "versions.env"


def version(versions: Path = VERSIONS) -> str:
    for line in versions.read_text().splitlines():
        if line.startswith("KTLS_UTILS_VERSION="):
            return line.split("=", 1)[1].split()[0]
    raise BuildError("versions.env has no KTLS_UTILS_VERSION")


def _run(argv: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd, check=False)
    if proc.returncode:
        raise BuildError(f"{' '.join(argv[:2])} ... failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-400:]}")
    return proc.stdout


def ensure_tlshd(cache: Path | None = None) -> Path:
    """The cached ``tlshd`` of the pinned ktls-utils, fetched and unpacked when missing."""
    want = version()
    root = (cache or machine_cache() / "tools") / f"ktls-utils-{want}"
    daemon = root / "usr" / "sbin" / "tlshd"
    if daemon.exists():
        return daemon
    apt = apt_options(SUITE, CACHE)
    downloads = root.with_name(root.name + ".dl")
    downloads.mkdir(parents=True, exist_ok=True)
    try:
        _run(["apt-get", *apt, "download", f"ktls-utils={want}"], cwd=downloads)
    except BuildError:
        _run(["apt-get", *apt, "update", "-qq"])  # package lists missing or stale
        _run(["apt-get", *apt, "download", f"ktls-utils={want}"], cwd=downloads)
    debs = sorted(downloads.glob("ktls-utils_*.deb"))
    if not debs:
        raise BuildError(f"apt-get download ktls-utils={want} left no .deb in {downloads}")
    staging = root.with_name(root.name + ".tmp")
    _run(["rm", "-rf", str(staging)])
    _run(["dpkg-deb", "-x", str(debs[-1]), str(staging)])
    _run([str(staging / "usr" / "sbin" / "tlshd"), "--help"])  # runs on this system's libraries (rc 0 on usage)
    os.replace(staging, root)
    _run(["rm", "-rf", str(downloads)])
    return daemon


def start_tlshd(vm: LabVM, daemon: Path, timeout: float = 30) -> None:
    """One ``tlshd`` in ``vm`` (idempotent), with the kernel's TLS and AES-GCM modules loaded."""
    for module in ("tls", "gcm", "ghash-generic"):
        vm.check(["modprobe", module], timeout=30)
    vm.run(["modprobe", "aesni-intel"], 30)  # faster AES where the (emulated) CPU has it; optional
    if vm.run(["pidof", "tlshd"], 10).rc == 0:
        return
    vm.check(["mkdir", "-p", os.path.dirname(CONF)], timeout=10)
    vm.write(CONF, CONF_TEXT)
    vm.check(["sh", "-c", f"setsid {daemon} -c {CONF} -s </dev/null >{LOG} 2>&1 &"], timeout=30)
    deadline = time.monotonic() + timeout
    while vm.run(["pidof", "tlshd"], 10).rc != 0:
        if time.monotonic() > deadline:
            raise BuildError(f"tlshd did not start in the guest: {vm.run(['cat', LOG], 10).out[-400:]}")
        time.sleep(0.5)
