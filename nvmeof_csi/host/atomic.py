"""Crash-safe file writes: temp file, fsync, rename, fsync the directory.

Contract: after :func:`write_atomic` returns, the file holds exactly ``data`` even across a power cut; if it
raises or the process dies, the file holds its previous content (or is still absent). Safe to call
concurrently for *different* paths; callers serialise writers of the same path.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # made with mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode != 0o600:
                os.fchmod(handle.fileno(), mode)  # before the fsync: one journal commit covers it
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> Any | None:
    """The JSON document at ``path``, or ``None`` when the file is absent."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def remove_durably(path: Path) -> None:
    """Delete ``path`` (absent is fine) and make the deletion durable."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
