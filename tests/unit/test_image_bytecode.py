"""``image.base.stale_bytecode``: what a read-only root would compile at every import."""

from __future__ import annotations

import os
import py_compile
from pathlib import Path

from image.base import stale_bytecode


def module(site: Path, name: str, mode: py_compile.PycInvalidationMode | None) -> Path:
    source = site / f"{name}.py"
    source.write_text("X = 1\n")
    if mode is not None:
        py_compile.compile(str(source), invalidation_mode=mode, doraise=True)
    return source


def test_timestamp_bytecode_is_stale_once_the_source_time_moves_and_hash_bytecode_never(tmp_path: Path) -> None:
    fresh = module(tmp_path, "fresh", py_compile.PycInvalidationMode.TIMESTAMP)
    moved = module(tmp_path, "moved", py_compile.PycInvalidationMode.TIMESTAMP)
    hashed = module(tmp_path, "hashed", py_compile.PycInvalidationMode.UNCHECKED_HASH)
    module(tmp_path, "bare", None)
    st = moved.stat()
    os.utime(moved, (st.st_atime, st.st_mtime + 1))  # what a packed layer did to pip's files: one second on
    os.utime(hashed, (st.st_atime, st.st_mtime + 1))
    assert stale_bytecode(tmp_path) == ["bare.py", "moved.py"]
    assert fresh.exists()
