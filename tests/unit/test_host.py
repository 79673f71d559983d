import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.errors import CommandError
from nvmeof_csi.host import atomic
from nvmeof_csi.host.executor import Result, SubprocessExecutor, redact
from nvmeof_csi.host.mounter import MAX_STACKED, Mounter, escape_path, parse_mountinfo


def test_mountinfo_parse_with_escapes_and_optional_fields() -> None:
    text = (
        "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
        "37 35 7:0 / /staging ro shared:5 unbindable - xfs /dev/loop0 ro\n"
        "garbage line\n"
    )
    mounts = parse_mountinfo(text)
    assert [m.mount_point for m in mounts] == ["/mnt/with space", "/staging"]
    assert mounts[0].root == "/mnt1" and mounts[0].fstype == "ext3" and not mounts[0].readonly
    assert mounts[1].source == "/dev/loop0" and mounts[1].readonly and mounts[1].device == "7:0"


def test_mount_at_finds_the_top_most_mount_of_exactly_that_path(tmp_path: Path) -> None:
    """Only the lines naming the path are parsed; a path that is another's prefix, a bind mount's root or the
    source field equal to it, and an escaped name (space, backslash) are each told apart."""
    odd = str(tmp_path / "a b\\c")
    info = tmp_path / "mountinfo"
    info.write_text(
        f"40 1 7:0 / {escape_path(odd)} rw - ext4 /dev/loop0 rw\n"
        f"41 40 7:1 / {escape_path(odd)} ro - ext4 /dev/loop1 ro\n"  # stacked on top: this one counts
        f"42 1 7:2 / {escape_path(odd)}x rw - ext4 {escape_path(odd)} rw\n"  # a longer path, the source our path
        f"43 1 7:3 {escape_path(odd)} /elsewhere rw - ext4 /dev/loop3 rw\n"  # our path as a bind mount's root
    )
    mounter = Mounter(SubprocessExecutor(), mountinfo=info)
    top = mounter.mount_at(odd)
    assert top is not None and top.source == "/dev/loop1" and top.readonly
    longer = mounter.mount_at(odd + "x")
    assert longer is not None and longer.device == "7:2"
    assert mounter.mount_at(str(tmp_path / "a")) is None
    assert mounter.mount_at("/elsewhere") is not None
    assert mounter.mount_at(str(tmp_path)) is None
    assert escape_path("/x y\tz\\") == "/x\\040y\\011z\\134"


def test_unmount_takes_every_stacked_mount_with_one_read_and_tolerates_one_taken_away(tmp_path: Path) -> None:
    from tests.support.fakes import FakeHost

    host = FakeHost(tmp_path / "mountinfo")
    mounter = Mounter(host, mountinfo=tmp_path / "mountinfo")
    target, other = str(tmp_path / "t"), str(tmp_path / "o")
    for source in ("/dev/a", "/dev/b", "/dev/c"):
        mounter.mount(source, target, "ext4")
    mounter.mount("/dev/d", other, "ext4")
    mounter.unmount(target)
    assert mounter.mount_at(target) is None and mounter.mount_at(other) is not None
    assert [a for a in host.argvs if a[0] == "umount"] == [["umount", target]] * 3

    class TakenAway(FakeHost):  # another process unmounts it between our read of the table and our umount
        def run(self, argv: Sequence[str], **kw: Any) -> Result:
            if argv[0] == "umount":
                self.mountinfo.write_text("")
            return super().run(argv, **kw)

    racing = TakenAway(tmp_path / "mountinfo2")
    mounter = Mounter(racing, mountinfo=tmp_path / "mountinfo2")
    mounter.mount("/dev/a", target, "ext4")
    mounter.unmount(target)  # umount says "not mounted": what unmount reaches, no error
    assert racing.argvs[-1] == ["umount", target]
    mounter = Mounter(host, mountinfo=tmp_path / "mountinfo")
    mounter.mount("/dev/a", target, "ext4")
    host.fail["umount"] = CommandError(["umount", target], 32, "", "target is busy")
    with pytest.raises(CommandError):  # still mounted after umount failed: the failure is real
        mounter.unmount(target)


def test_unmount_with_the_kernels_answer_reads_no_table_and_stops_where_it_cannot_finish(tmp_path: Path) -> None:
    from tests.support.fakes import FakeHost

    host = FakeHost(tmp_path / "mountinfo")
    target = str(tmp_path / "t")
    for source in ("/dev/a", "/dev/b", "/dev/c"):
        Mounter(host, mountinfo=host.mountinfo).mount(source, target, "ext4")

    def kernel(path: str) -> bool:  # what statx would say: a mount's root is there while the table lists one
        return f" {path} " in host.mountinfo.read_text()

    no_table = tmp_path / "none"  # any read of the Mounter's own table would raise FileNotFoundError
    Mounter(host, mountinfo=no_table, mount_root=kernel).unmount(target)
    assert [a for a in host.argvs if a[0] == "umount"] == [["umount", target]] * 3
    assert Mounter(host, mountinfo=no_table, mount_root=kernel).mount_at(target) is None

    answers = iter([True, None, None, None, None])  # the kernel answers once, then cannot tell: the table decides
    Mounter(host, mountinfo=host.mountinfo).mount("/dev/a", target, "ext4")
    Mounter(host, mountinfo=host.mountinfo).mount("/dev/b", target, "ext4")
    host.argvs.clear()
    Mounter(host, mountinfo=host.mountinfo, mount_root=lambda p: next(answers)).unmount(target)
    assert [a for a in host.argvs if a[0] == "umount"] == [["umount", target]] * 2

    class Stuck(FakeHost):  # every umount succeeds, yet a mount's root stays there: bounded, then an error
        def run(self, argv: Sequence[str], **kw: Any) -> Result:
            self.argvs.append(list(argv))
            return Result(0, "", "")

    stuck = Stuck(tmp_path / "mountinfo3")
    with pytest.raises(CommandError, match="still mounted"):
        Mounter(stuck, mountinfo=stuck.mountinfo, mount_root=lambda p: True).unmount(target)
    assert len(stuck.argvs) == MAX_STACKED


def test_atomic_write_keeps_old_content_when_rename_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    atomic.write_json_atomic(target, {"v": 1})

    def broken(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk gone"):
        atomic.write_json_atomic(target, {"v": 2})
    assert atomic.read_json(target) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp files left


def test_atomic_write_over_a_crashed_writers_leftover_and_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "rec.json"
    leftover = tmp_path / f".rec.json.{os.getpid()}-{threading.get_ident()}.tmp"  # same name a crash would leave
    leftover.write_bytes(b"half a record that is much longer than the new one")
    leftover.chmod(0o666)
    atomic.write_atomic(target, b"whole", mode=0o644)
    assert target.read_bytes() == b"whole" and oct(target.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["rec.json"]


def test_atomic_write_never_follows_a_symlink_planted_as_its_temp_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / f".rec.json.{os.getpid()}-{threading.get_ident()}.tmp").symlink_to(victim)
    with pytest.raises(OSError):
        atomic.write_atomic(tmp_path / "rec.json", b"x")
    assert victim.read_bytes() == b"keep" and not (tmp_path / "rec.json").exists()


def test_atomic_write_makes_missing_folders(tmp_path: Path) -> None:
    atomic.write_atomic(tmp_path / "a" / "b" / "rec.json", b"x")
    assert (tmp_path / "a" / "b" / "rec.json").read_bytes() == b"x"


def test_atomic_read_absent_and_remove(tmp_path: Path) -> None:
    assert atomic.read_json(tmp_path / "none.json") is None
    atomic.write_atomic(tmp_path / "a", b"x")
    assert oct((tmp_path / "a").stat().st_mode & 0o777) == "0o600"
    atomic.remove_durably(tmp_path / "a")
    atomic.remove_durably(tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_executor_redacts_secrets_in_errors() -> None:
    with pytest.raises(CommandError) as info:
        SubprocessExecutor().run(["sh", "-c", "exit 3", "--dhchap-secret=HIDE"], timeout=5, secrets=["HIDE"])
    assert "HIDE" not in str(info.value) and "***" in str(info.value)
    assert info.value.rc == 3


def test_executor_timeout_and_missing_tool() -> None:
    with pytest.raises(CommandError) as info:
        SubprocessExecutor().run(["sleep", "5"], timeout=0.2)
    assert info.value.rc == -9
    with pytest.raises(CommandError) as info:
        SubprocessExecutor().run(["no-such-tool-xyz"], timeout=1)
    assert info.value.rc == 127
    assert SubprocessExecutor().run(["sh", "-c", "exit 4"], timeout=5, check=False).rc == 4
    assert redact(["a=s", "b"], ["s"]) == ["a=***", "b"]


def test_mount_points_are_made_and_removed_by_the_mounter_without_following_symlinks(tmp_path: Path) -> None:
    from nvmeof_csi.host.mounter import Mounter

    folder, device = tmp_path / "a" / "b" / "mount", tmp_path / "c" / "dev"
    for _ in range(2):  # idempotent
        Mounter.make_mount_point(folder)
        Mounter.make_mount_point(device, block=True)
    assert folder.is_dir() and device.is_file() and device.stat().st_size == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "link").symlink_to(victim)
    Mounter.remove_mount_point(tmp_path / "link")
    assert victim.is_dir() and not (tmp_path / "link").exists()
    for path in (folder, device, tmp_path / "absent"):
        Mounter.remove_mount_point(path)
        assert not path.exists()
