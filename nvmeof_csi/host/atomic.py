"""Crash-safe file writes: temp file, fsync, rename, fsync the directory.

Contract: after :func:`write_atomic` returns, the file holds exactly ``data`` even across a power cut; if it
raises or the process dies, the file holds its previous content (or is still absent). Safe to call
concurrently for *different* paths; callers serialise writers of the same path.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably. The temp file beside it is named after the file,
    this process and this thread (``.NAME.PID-TID.tmp``: one writer at a time per path, as the contract asks,
    never shares it with another), so no random name has to be tried; readers of a folder skip dot-files."""
    parent = path.parent
    tmp = os.path.join(parent, f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, mode)
        except FileNotFoundError:  # the folder itself is new: made on first use, not looked at on every write
            parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, flags, mode)
        try:
            os.fchmod(fd, mode)  # whatever a leftover of a crashed writer had; before the fsync (one commit)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(parent)


def create_exclusive(path: Path, data: bytes, mode: int = 0o600) -> bool:
    """Create ``path`` holding ``data`` unless it exists; ``True`` when this call created it. One atomic step
    (a hard link of a complete, fsynced temp file, which fails if ``path`` exists), so of any number of racing
    callers, also in other processes, exactly one creates it and every reader sees either no file or all of
    ``data``; durable when it returns ``True``."""
    parent = path.parent
    tmp = parent / f".{path.name}.{os.getpid()}-{threading.get_ident()}.new"
    try:
        write_atomic(tmp, data, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(parent)
    return True


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
