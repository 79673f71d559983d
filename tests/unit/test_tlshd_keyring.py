"""``nvmeof-csi tlshd``: the .nvme keyring's serial published by the driver's container, checked, linked into the
session keyring and then the daemon exec'd; anything else refused before the daemon starts."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nvmeof_csi.cmd.main import app
from nvmeof_csi.errors import ConfigError
from nvmeof_csi.host import keyring as kernel_keys
from nvmeof_csi.host.tlshd_keyring import KeyOps, launch, publish_serial, publish_when_found, read_serial
from tests.unit.test_tls import FakeKeyring

DAEMON = ["/usr/sbin/tlshd", "-s", "-c", "/etc/tlshd.conf"]


class Kernel:
    """What :func:`launch` asked of the kernel, with a key table of ``serial -> description``."""

    def __init__(self, keys: dict[int, str]) -> None:
        self.keys, self.now = keys, 0.0
        self.linked: list[int] = []
        self.execs: list[list[str]] = []

    def describe(self, serial: int) -> str:
        if serial not in self.keys:
            raise OSError(126, "Required key not available")
        return self.keys[serial]

    def ops(self, appear_after: float | None = 0.0, file: Path | None = None, text: str = "") -> KeyOps:
        def sleep(s: float) -> None:
            self.now += s
            if file is not None and appear_after is not None and self.now >= appear_after:
                file.write_text(text)

        return KeyOps(
            describe=self.describe,
            link=self.linked.append,
            execv=lambda path, argv: self.execs.append([path, *argv]),
            sleep=sleep,
            clock=lambda: self.now,
        )


NVME = "keyring;0;0;1f1f0000;.nvme"


def test_the_published_serial_is_checked_linked_and_the_daemon_started_only_then(tmp_path: Path) -> None:
    serial_file = tmp_path / "serial"
    kernel = Kernel({0x2E570F63: NVME})
    # the driver's container publishes it 3 s after the daemon's container started
    launch(serial_file, DAEMON, wait=60, ops=kernel.ops(appear_after=3, file=serial_file, text=f"{0x2E570F63}\n"))
    assert kernel.linked == [0x2E570F63]
    assert kernel.execs == [[DAEMON[0], *DAEMON]]


@pytest.mark.parametrize(
    ("text", "keys", "why"),
    [
        ("12345\n", {12345: "psk;0;0;3b010000;NVMe0R01 host subsys"}, "not the .nvme keyring"),  # a key, not a ring
        ("12345\n", {12345: "keyring;0;0;3f1b0000;_ses.abc"}, "not the .nvme keyring"),  # another keyring
        ("12345\n", {}, "cannot be described"),  # no such key (or no view permission)
        ("-3\n", {-3: NVME}, "does not hold a key serial"),  # a special keyring id is no serial
        ("0x2e570f63\n", {}, "does not hold a key serial"),
        ("99999999999\n", {}, "does not hold a key serial"),  # past 2**31-1
    ],
)
def test_a_file_that_names_anything_but_the_nvme_keyring_starts_nothing(
    tmp_path: Path, text: str, keys: dict[int, str], why: str
) -> None:
    serial_file = tmp_path / "serial"
    serial_file.write_text(text)
    kernel = Kernel(keys)
    with pytest.raises(ConfigError, match=why):
        launch(serial_file, DAEMON, wait=60, ops=kernel.ops())
    assert kernel.linked == [] and kernel.execs == []


def test_no_file_within_the_wait_ends_with_the_modules_to_load_and_starts_nothing(tmp_path: Path) -> None:
    kernel = Kernel({1: NVME})
    with pytest.raises(ConfigError, match=r"did not appear in 30s.*nvmet-tcp"):
        launch(tmp_path / "serial", DAEMON, wait=30, ops=kernel.ops(appear_after=None))
    assert kernel.now >= 30 and kernel.linked == [] and kernel.execs == []


def test_a_link_the_kernel_refuses_starts_nothing(tmp_path: Path) -> None:
    serial_file = tmp_path / "serial"
    serial_file.write_text("7\n")
    kernel = Kernel({7: NVME})
    ops = kernel.ops()

    def refuse(serial: int) -> None:
        raise OSError(13, "Permission denied")

    ops.link = refuse
    with pytest.raises(ConfigError, match="cannot be linked into the session: Permission denied"):
        launch(serial_file, DAEMON, wait=5, ops=ops)
    assert kernel.execs == []


def test_the_driver_publishes_the_serial_once_the_kernel_has_the_keyring(tmp_path: Path) -> None:
    serial_file = tmp_path / "serial"
    assert not publish_serial(serial_file, FakeKeyring(tmp_path, present=False))
    assert not serial_file.exists()
    assert publish_serial(serial_file, FakeKeyring(tmp_path))
    assert read_serial(serial_file) == 0x2E570F63 and serial_file.stat().st_mode & 0o777 == 0o644
    # the loop ends once published; a stopped loop publishes nothing
    (tmp_path / "again").unlink(missing_ok=True)
    publish_when_found(tmp_path / "again", FakeKeyring(tmp_path), period=0.01)(threading.Event())
    assert read_serial(tmp_path / "again") == 0x2E570F63
    stopped = threading.Event()
    stopped.set()
    publish_when_found(tmp_path / "never", FakeKeyring(tmp_path), period=0.01)(stopped)
    assert not (tmp_path / "never").exists()


def test_the_command_exits_2_with_one_line_and_takes_the_daemon_after_the_dashes(tmp_path: Path) -> None:
    serial_file = tmp_path / "serial"
    serial_file.write_text("not a number\n")
    result = CliRunner().invoke(app, ["tlshd", "--serial-file", str(serial_file), "--wait-seconds", "0", "--", *DAEMON])
    assert result.exit_code == 2, result.output
    assert "does not hold a key serial" in result.output
    result = CliRunner().invoke(app, ["tlshd", "--serial-file", str(serial_file), "--", "tlshd", "-s"])
    assert result.exit_code == 2 and "absolute path" in result.output


def test_the_kernel_calls_describe_this_process_session_keyring() -> None:
    """The real ``KEYCTL_DESCRIBE`` (no fake): this process's own session keyring is a keyring it can view."""
    assert kernel_keys.describe_key(kernel_keys.KEY_SPEC_SESSION_KEYRING).startswith("keyring;")
