"""``nvmeof-csi tlshd``: start the TLS handshake daemon in its own container with the kernel's ``.nvme`` keyring
linked into its session keyring (:mod:`nvmeof_csi.host.tlshd_keyring` says why and how)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvmeof_csi.cmd.exits import settings_or_exit
from nvmeof_csi.rpc import logctx

SERIAL_FILE = Path("/run/nvme-keyring/serial")


def tlshd_command(
    daemon: Annotated[
        list[str], typer.Argument(help="The daemon and its arguments, after `--`: `-- /usr/sbin/tlshd -s -c FILE`.")
    ],
    serial_file: Annotated[
        Path,
        typer.Option(
            envvar="NVMEOF_CSI_KEYRING_SERIAL_FILE",
            help="Where the agent or node plugin (`--keyring-serial-file`) publishes the .nvme keyring's serial.",
        ),
    ] = SERIAL_FILE,
    wait_seconds: Annotated[
        float, typer.Option(min=0, help="How long to wait for that file before exiting 2 (the container restarts).")
    ] = 600.0,
) -> None:
    """Link the kernel's .nvme keyring into this process's session keyring, then exec the TLS handshake daemon.

    A container cannot find .nvme itself (the runtime masks /proc/keys); the driver's container publishes its
    serial on a volume the two share. Exits 2 with one line when the file does not come, or names another key."""
    from nvmeof_csi.host.tlshd_keyring import launch  # noqa: PLC0415 - only this command's process loads it

    logctx.install("info")
    settings_or_exit("nvmeof-csi tlshd", lambda: launch(serial_file, daemon, wait_seconds))
