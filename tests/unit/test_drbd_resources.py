"""``agent.drbd.DrbdResources``: the drbdadm-84 commands each step runs, a promotion DRBD refuses surfaced as
FailedPrecondition, and the shared secret kept out of every error."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from nvmeof_csi.agent.drbd import DrbdResources
from nvmeof_csi.errors import CommandError, FailedPrecondition, InvalidArgument, Unavailable
from nvmeof_csi.host.executor import Result

VOL = "0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01"
RES = f"nv-{VOL}"
SECRET = "0123456789abcdef0123456789abcdef"
UP = " 7: cs:Connected ro:Secondary/Secondary ds:UpToDate/UpToDate C r-----\n"


class Drbdadm:
    """Records argv; fails the commands listed in ``fail`` with drbdadm's output (which echoes the secret)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail: dict[str, str] = {}

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True, stdin: str | None = None,
            secrets: Sequence[str] = ()) -> Result:  # fmt: skip
        self.calls.append(list(argv))
        for word, err in self.fail.items():
            if word in argv:
                shown = [a.replace(SECRET, "***") for a in argv]
                raise CommandError(shown, 11, "", err)
        return Result(0, "", "")


def resources(tmp_path: Path, proc: str = "") -> tuple[DrbdResources, Drbdadm]:
    adm = Drbdadm()
    return DrbdResources(adm, tmp_path / "drbd", adm="drbdadm-84", read_proc=lambda: proc), adm


def test_each_step_is_one_drbdadm_command_on_the_volumes_own_file(tmp_path: Path) -> None:
    res, adm = resources(tmp_path)
    res.write(VOL, "resource text")
    conf = tmp_path / "drbd" / f"{RES}.res"
    assert conf.read_text() == "resource text" and stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert stat.S_IMODE(conf.parent.stat().st_mode) == 0o700
    res.create_metadata(VOL, SECRET)
    res.up(VOL, SECRET, 7)
    res.skip_initial_sync(VOL, SECRET)
    res.promote(VOL, SECRET)
    res.demote(VOL, SECRET)
    res.discard_mine(VOL, SECRET)
    base = ["drbdadm-84", "-c", str(conf)]
    assert adm.calls == [
        [*base, "--", "--force", "create-md", RES],
        [*base, "up", RES],
        [*base, "--", "--clear-bitmap", "new-current-uuid", RES],
        [*base, "primary", RES],  # never --force
        [*base, "secondary", RES],
        [*base, "--", "--discard-my-data", "connect", RES],  # StandAlone: no disconnect first
    ]
    res.down(VOL, SECRET, 7)  # not configured: nothing to stop, the file goes
    assert len(adm.calls) == 6 and not conf.exists()


def test_a_configured_minor_is_adjusted_not_brought_up_twice_and_is_taken_down(tmp_path: Path) -> None:
    res, adm = resources(tmp_path, UP)
    res.up(VOL, SECRET, 7)
    res.down(VOL, SECRET, 7)
    assert [c[3] for c in adm.calls] == ["adjust", "down"]
    assert res.state(7) is not None and res.state(8) is None


def test_a_replica_drbd_refuses_to_promote_is_a_failed_precondition(tmp_path: Path) -> None:
    res, adm = resources(tmp_path)
    adm.fail["primary"] = "100: State change failed: (-2) Need access to UpToDate data\n"
    with pytest.raises(FailedPrecondition, match="cannot be primary"):
        res.promote(VOL, SECRET)


def test_the_secret_is_in_no_error_even_when_drbdadm_prints_it(tmp_path: Path) -> None:
    res, adm = resources(tmp_path)
    adm.fail["up"] = f"drbdsetup-84 connect {RES} --shared-secret={SECRET}: failed\n"
    with pytest.raises(CommandError) as caught:
        res.up(VOL, SECRET, 7)
    assert SECRET not in str(caught.value) and SECRET not in caught.value.err and "***" in caught.value.err


def test_a_hostile_volume_id_names_no_file(tmp_path: Path) -> None:
    res, adm = resources(tmp_path)
    with pytest.raises(InvalidArgument):
        res.write("../../etc/passwd", "x")
    assert adm.calls == [] and not (tmp_path / "drbd").exists()


def test_a_resize_returns_once_the_device_has_grown_and_is_unavailable_while_the_peer_has_not_answered(
    tmp_path: Path,
) -> None:
    adm = Drbdadm()
    sizes = iter([64 << 20, 64 << 20, 80 << 20])  # the Primary grows once its peer answers with its own size
    res = DrbdResources(adm, tmp_path / "drbd", read_proc=str, device_bytes=lambda minor: next(sizes), grow_wait=5)
    res.resize(VOL, SECRET, 7, 80 << 20)
    assert [c[-2] for c in adm.calls] == ["resize"] and next(sizes, None) is None  # it waited for the third look
    stuck = DrbdResources(adm, tmp_path / "drbd", read_proc=str, device_bytes=lambda minor: 64 << 20, grow_wait=0)
    with pytest.raises(Unavailable, match=r"not yet 83886080 \(its peer has not answered"):
        stuck.resize(VOL, SECRET, 7, 80 << 20)
