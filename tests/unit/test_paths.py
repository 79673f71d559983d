"""Paths built from input never leave their roots."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.host.paths import child, inside
from nvmeof_csi.nvmeof.nqn import check_host_nqn, check_uuid, valid_host_nqn

ROOT = Path("/srv/root")
GOOD_NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "/etc/passwd", "a/b", "a\x00b", "a\nb", "x" * 256])
def test_child_refuses_anything_but_one_plain_component(name: str) -> None:
    with pytest.raises(InvalidArgument):
        child(ROOT, name, "name")


@given(st.text(min_size=1, max_size=80))
def test_child_is_always_directly_inside_the_root(name: str) -> None:
    try:
        path = child(ROOT, name, "name")
    except InvalidArgument:
        return
    assert path.parent == ROOT and path.name == name


def test_inside_follows_symlinks(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "escape").symlink_to("/etc")
    assert inside(tmp_path / "root", tmp_path / "root" / "ok", "p") == (tmp_path / "root" / "ok").resolve()
    with pytest.raises(InvalidArgument, match="not under"):
        inside(tmp_path / "root", tmp_path / "root" / "escape" / "passwd", "p")


@pytest.mark.parametrize(
    "value", ["", "x", "../1", "3F6C1F8E-0000-4000-8000-000000000001", "{3f6c1f8e-0000-4000-8000-000000000001}"]
)
def test_only_canonical_uuids(value: str) -> None:
    with pytest.raises(InvalidArgument):
        check_uuid(value, "uuid")
    assert check_uuid("3f6c1f8e-0000-4000-8000-000000000001", "uuid")


@pytest.mark.parametrize("suffix", ["\n", "\x00", "\r", " "])
def test_host_nqn_pattern_is_anchored_at_the_end(suffix: str) -> None:
    assert valid_host_nqn(GOOD_NQN)
    assert not valid_host_nqn(GOOD_NQN + suffix)
    with pytest.raises(InvalidArgument):
        check_host_nqn(GOOD_NQN + suffix)
