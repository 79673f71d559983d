"""Primitive operations on a configfs tree (or a plain folder standing in for one in tests): read and write
attributes, make and remove objects (folders), link and unlink them, list a group.

Contract: reads of an absent attribute return ""; ``_write`` writes only what differs, ``_put`` writes without
looking; ``_mkdir`` says whether the object is new; removals of what is already gone succeed. A refused
operation raises :class:`ConfigfsError` naming the path and the errno text (never a DH-HMAC-CHAP key: an
attribute whose name holds "key" is shown as "a key"). Not thread-safe; callers serialise.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from nvmeof_csi.errors import DriverError


class ConfigfsError(DriverError):
    """The kernel refused a configfs operation."""


def refusal(exc: OSError) -> str:
    return exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))


#: a path in the tree: the object model builds plain strings on its hot paths (no ``Path`` object per step)
AnyPath = str | Path


class ConfigfsTree:
    """The primitives over the tree at ``root``."""

    def __init__(self, root: Path, plain_tree: bool = False) -> None:
        """``plain_tree``: ``root`` is an ordinary folder standing in for configfs (tests), so removing an
        object also removes the attribute files and default groups configfs would drop by itself, and the
        folders the kernel makes (``subsystems``, ``ports``, ``hosts``) are made here when missing."""
        self.root = root
        self._plain = plain_tree
        if plain_tree:
            for sub in ("subsystems", "ports", "hosts"):
                (root / sub).mkdir(parents=True, exist_ok=True)

    # -- primitives ----------------------------------------------------------------------------------------
    def _read(self, path: AnyPath) -> str:
        try:
            with open(path) as handle:
                return handle.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            return ""
        except OSError as exc:
            raise ConfigfsError(f"read {path}: {refusal(exc)}") from exc

    def _write(self, path: AnyPath, value: str) -> bool:
        """Write ``value`` unless the attribute already holds it; True when it wrote."""
        if self._read(path) == value:
            return False
        self._put(path, value)
        return True

    def _put(self, path: AnyPath, value: str) -> None:
        """Write ``value`` without looking first (an attribute of an object made a moment ago)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            shown = "a key" if "key" in os.path.basename(path) else repr(value)  # DH-HMAC-CHAP keys never shown
            raise ConfigfsError(f"write {shown} to {path}: {refusal(exc)}") from exc

    def _mkdir(self, path: AnyPath) -> bool:
        """Make the folder (an object, in configfs); True when it did not exist before."""
        try:
            os.mkdir(path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise ConfigfsError(f"mkdir {path}: {refusal(exc)}") from exc
        return True

    def _rmdir(self, path: AnyPath) -> None:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY and self._plain:
                self._rmdir_plain(Path(path))
                return
            raise ConfigfsError(f"rmdir {path}: {refusal(exc)}") from exc

    def _rmdir_plain(self, path: Path) -> None:
        """What configfs does on rmdir of an object: its attributes and empty default groups go with it."""
        for entry in path.iterdir():
            if entry.is_symlink():
                raise ConfigfsError(f"rmdir {path}: still linked from {entry.name}")
            if entry.is_dir():
                self._rmdir_plain(entry)
            else:
                entry.unlink()
        path.rmdir()

    def _link(self, target: AnyPath, link: AnyPath) -> None:
        if os.path.islink(link):
            return
        try:
            os.symlink(target, link)
        except FileExistsError:
            return
        except OSError as exc:
            raise ConfigfsError(f"link {link} -> {target}: {refusal(exc)}") from exc

    def _unlink(self, link: AnyPath) -> None:
        try:
            os.unlink(link)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigfsError(f"unlink {link}: {refusal(exc)}") from exc

    @staticmethod
    def _names(folder: AnyPath) -> list[str]:
        try:
            return sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []
