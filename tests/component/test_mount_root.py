"""The kernel's own answer to "is a mount's root here?" (statx STATX_ATTR_MOUNT_ROOT), checked against real bind
mounts of a folder and of a file on this host, and the Mounter reading no mount table when it has that answer."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmeof_csi.host.executor import SubprocessExecutor
from nvmeof_csi.host.mount_root import MountRoots
from nvmeof_csi.host.mounter import Mounter
from tests.support.env import need


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    need(os.geteuid() == 0, "needs root (mount)")
    need(MountRoots()("/") is not None, "the kernel does not report STATX_ATTR_MOUNT_ROOT (Linux < 5.8)")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "data").write_text("x")
    (tmp_path / "dst").mkdir()
    (tmp_path / "file").write_text("")
    yield tmp_path
    for point in ("dst", "file", "dst"):
        subprocess.run(["umount", str(tmp_path / point)], capture_output=True, check=False)


def test_statx_tells_a_mounts_root_from_a_plain_folder_or_file(tree: Path) -> None:
    roots = MountRoots()
    assert roots("/") is True and roots("/proc") is True
    assert roots(str(tree / "dst")) is False and roots(str(tree / "file")) is False
    subprocess.run(["mount", "--bind", str(tree / "src"), str(tree / "dst")], check=True)
    subprocess.run(["mount", "--bind", str(tree / "src" / "data"), str(tree / "file")], check=True)
    # a bind mount from the same filesystem: st_dev alike, still a mount's root (os.path.ismount says no)
    assert roots(str(tree / "dst")) is True and roots(str(tree / "file")) is True
    assert roots(str(tree / "dst" / "data")) is False
    (tree / "link").symlink_to(tree / "dst")
    assert roots(str(tree / "link")) is False  # the link itself: the Mounter resolves symlinks first


def test_a_missing_path_has_no_mount_and_what_statx_cannot_answer_is_left_to_the_table(tree: Path) -> None:
    roots = MountRoots()
    assert roots(str(tree / "missing")) is False and roots(str(tree / "file" / "below")) is False  # no such path
    assert roots("relative/path") is None
    assert roots("/bad\0path") is None


def test_the_mounter_unmounts_stacked_binds_without_reading_the_table(tree: Path) -> None:
    gone = tree / "no-table"  # the Mounter would fail on any read of its table: there is none
    mounter = Mounter(SubprocessExecutor(), gone, mount_root=MountRoots())
    for _ in range(2):  # two mounts stacked at one path
        subprocess.run(["mount", "--bind", str(tree / "src"), str(tree / "dst")], check=True)
    assert mounter.mount_at(tree / "file") is None  # nothing there: answered without the table
    mounter.unmount(tree / "dst")
    assert MountRoots()(str(tree / "dst")) is False
    mounter.unmount(tree / "dst")  # nothing mounted is fine
    with pytest.raises(FileNotFoundError):
        mounter.mount_at("/")  # a mount's details still come from the table
