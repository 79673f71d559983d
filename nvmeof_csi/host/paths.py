"""Paths built from input stay under their roots.

Contract: :func:`component` returns ``name`` and :func:`child` returns ``root / name`` only for a single,
plain path component (not empty, not ``.`` or ``..``, no ``/``, NUL or other control character), so the
result always sits directly inside ``root``; anything else raises ``InvalidArgument`` naming ``what``.
:func:`inside` resolves a path (following symlinks) and raises ``InvalidArgument`` unless it stays under
``root``. Neither touches the filesystem beyond ``resolve``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from nvmeof_csi.errors import InvalidArgument

_UNSAFE = re.compile(r"[/\x00-\x1f\x7f]")
MAX_COMPONENT_BYTES = 255


def component(name: str, what: str) -> str:
    """``name`` itself when it is a plain single path component (see the module docstring), so that joining it
    to a folder's path with one ``/`` names an entry directly inside that folder; else ``InvalidArgument``."""
    if not name or name in (".", "..") or _UNSAFE.search(name) or len(name.encode()) > MAX_COMPONENT_BYTES:
        raise InvalidArgument(
            f"{what} {name[:300]!r} cannot name an object (empty, '.', '..', '/', control "
            f"characters or over {MAX_COMPONENT_BYTES} bytes)"
        )
    return name


def child(root: Path, name: str, what: str) -> Path:
    """``root / name`` for a plain single component ``name``; see the module docstring."""
    path = root / component(name, what)
    if path.parent != root:
        raise InvalidArgument(f"{what} {name[:300]!r} escapes {root}")
    return path


def inside(root: Path, path: Path, what: str) -> Path:
    """``path`` resolved, provided it stays under ``root`` (resolved too)."""
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and not real.is_relative_to(real_root):
        raise InvalidArgument(f"{what} {str(path)[:300]!r} is not under {root}")
    return real


def confined(root: Path, text: str, what: str) -> str:
    """``text`` when it is an absolute, normalised path strictly under ``root`` that also resolves (following
    the symlinks that exist) under ``root``; else ``InvalidArgument`` naming ``what``."""
    if not text.startswith("/") or os.path.normpath(text) != text or "\x00" in text:
        raise InvalidArgument(f"{what} {text[:300]!r} must be an absolute, normalised path")
    path = Path(text)
    if path == root or not path.is_relative_to(root):
        raise InvalidArgument(f"{what} {text[:300]!r} is not under {root}")
    inside(root, path, what)
    return text
