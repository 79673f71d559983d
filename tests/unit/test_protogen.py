"""The spec hash check must fail loudly; the lock file must parse."""

import hashlib
import shutil
from pathlib import Path

import pytest

from proto import protogen

ROOT = Path(__file__).resolve().parents[2]


def test_lock_parses() -> None:
    lock = protogen.SpecLock.read(ROOT / "proto" / "csi.lock")
    assert lock.module == "github.com/container-storage-interface/spec"
    assert lock.version == "v1.14.0"
    assert len(lock.sha256) == 64


def test_verify_rejects_a_changed_file(tmp_path: Path) -> None:
    spec = tmp_path / "csi.proto"
    spec.write_text('syntax = "proto3";\n')
    good = hashlib.sha256(spec.read_bytes()).hexdigest()
    protogen.verify(spec, good)
    spec.write_text('syntax = "proto3"; // tampered\n')
    with pytest.raises(protogen.HashMismatch, match="does not match the pinned"):
        protogen.verify(spec, good)


@pytest.mark.skipif(shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists(), reason="needs go")
def test_fetch_with_a_wrong_pin_fails_and_caches_nothing(tmp_path: Path) -> None:
    real = protogen.SpecLock.read(ROOT / "proto" / "csi.lock")
    wrong = protogen.SpecLock(real.module, real.version, real.file, "0" * 64)
    with pytest.raises(protogen.HashMismatch):
        protogen.fetch_spec(wrong, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_bad_lock_line(tmp_path: Path) -> None:
    bad = tmp_path / "csi.lock"
    bad.write_text("module github.com/x\n")
    with pytest.raises(protogen.ProtoGenError, match="key = value"):
        protogen.SpecLock.read(bad)
