"""Files the lab's CSI ops write and check inside a published volume (run in the lab VM): the I/O probe's file and
a data set of random files with its sha256 manifest."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any


def write_probe_file(folder: Path, mib: int) -> Path:
    """``folder/probe.bin`` of ``mib`` MiB, allocated and written once (so O_DIRECT I/O hits allocated,
    initialised blocks) and fsynced."""
    path = folder / "probe.bin"
    with path.open("wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, mib << 20)
        fh.write(b"\0" * (mib << 20))
        os.fsync(fh.fileno())
    return path


def write_dataset(root: Path, files: int, kib: int) -> dict[str, str]:
    """``files`` random files of ``kib`` KiB under ``root``, synced; returns file name -> sha256."""
    root.mkdir(exist_ok=True)
    manifest = {}
    for i in range(files):
        data = os.urandom(kib << 10)
        path = root / f"shard-{i:05d}.bin"
        path.write_bytes(data)
        manifest[path.name] = hashlib.sha256(data).hexdigest()
    os.sync()
    return manifest


def verify_dataset(root: Path, manifest: dict[str, str]) -> dict[str, Any]:
    """Drop the page cache (read from the device), re-read every file and compare it with ``manifest``."""
    Path("/proc/sys/vm/drop_caches").write_text("3")
    verified = mismatched = 0
    bad = []
    for file, digest in manifest.items():
        data = (root / file).read_bytes()
        if hashlib.sha256(data).hexdigest() == digest:
            verified += len(data)
        else:
            mismatched += 1
            bad.append(file)
    return {"bytes_verified": verified, "files": len(manifest), "mismatched": mismatched, "bad": bad[:5]}
