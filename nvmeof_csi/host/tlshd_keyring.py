"""The kernel's ``.nvme`` keyring handed to a ``tlshd`` that runs in a container of its own.

A container runtime masks ``/proc/keys`` (runc's default masked paths) and gives each container a session keyring
of its own. ``tlshd`` (ktls-utils 1.0, ``keyrings=.nvme``) finds ``.nvme`` by name in ``/proc/keys`` and links it
into its session keyring; in a container it cannot, and a target's handshake then fails (``failed to search 'psk'
key``): a PSK grants search to its possessor only, and only a keyring linked into the session makes its keys
possessed. The driver's own container (privileged: the agent, the node plugin) sees ``/proc/keys``. So:

- the driver publishes the keyring's serial, a number, in a file on a volume the two containers share
  (:func:`publish_serial`; :func:`publish_when_found` retries until the kernel has the keyring, which comes with
  the ``nvme-tcp`` / ``nvmet-tcp`` modules);
- ``nvmeof-csi tlshd`` in the daemon's container (:func:`launch`) waits for that file, checks that the serial
  names a keyring called ``.nvme`` (``KEYCTL_DESCRIBE``), links it into its session keyring (``KEYCTL_LINK``:
  link permission on ``.nvme``, which uid 0 holds; no capability) and execs ``tlshd``, which keeps the session
  keyring: every key in ``.nvme`` is then possessed, and searchable, by it and its handshake children.

Contract: :func:`launch` never links anything but a keyring described as ``keyring;...;.nvme`` (a file that says
otherwise is refused with :class:`ConfigError`, as is a file that does not come within ``wait`` seconds), and
never returns on success (``execv``). :func:`publish_serial` writes the file atomically (readers see the old
serial or the new one), mode 0644; it returns False, writing nothing, when the kernel has no ``.nvme`` keyring.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvmeof_csi.errors import ConfigError, FailedPrecondition
from nvmeof_csi.host.keyring import NvmeKeyring, describe_key, link_into_session

log = logging.getLogger(__name__)
MAX_SERIAL = 2**31 - 1  # key serials are positive 32-bit integers


def publish_serial(path: Path, keyring: NvmeKeyring) -> bool:
    """Write ``.nvme``'s serial (decimal) to ``path``; False when the kernel has no such keyring yet."""
    try:
        serial = keyring.serial()
    except FailedPrecondition:
        return False
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{serial}\n")
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return True


def publish_when_found(path: Path, keyring: NvmeKeyring, period: float = 5.0) -> Callable[[threading.Event], None]:
    """A background loop: :func:`publish_serial` every ``period`` seconds until it succeeds or ``stop`` is set."""

    def run(stop: threading.Event) -> None:
        waited = False
        while not stop.is_set():
            if publish_serial(path, keyring):
                log.info("the .nvme keyring's serial is in %s for the TLS handshake daemon", path)
                return
            if not waited:
                log.warning("no .nvme keyring yet (nvme-tcp / nvmet-tcp not loaded?): tlshd waits for %s", path)
                waited = True
            stop.wait(period)

    return run


def read_serial(path: Path) -> int:
    """The serial in ``path``: a decimal number in 1..2**31-1, else :class:`ConfigError`."""
    text = path.read_text(errors="replace").strip()
    if not text.isdigit() or not 0 < int(text) <= MAX_SERIAL:
        raise ConfigError(f"{path} does not hold a key serial (a decimal number): {text[:40]!r}")
    return int(text)


@dataclass
class KeyOps:
    """The kernel calls :func:`launch` makes, injectable for tests."""

    describe: Callable[[int], str] = describe_key
    link: Callable[[int], None] = link_into_session
    execv: Callable[[str, list[str]], None] = os.execv
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    exists: Callable[[Path], bool] = field(default=Path.is_file)


def launch(serial_file: Path, argv: Sequence[str], wait: float, ops: KeyOps | None = None) -> None:
    """Wait up to ``wait`` s for ``serial_file``, link the ``.nvme`` keyring it names into this process's session
    keyring, then exec ``argv`` (the daemon and its arguments)."""
    ops = ops or KeyOps()
    if not argv or not os.path.isabs(argv[0]):
        raise ConfigError(f"the daemon to start must be an absolute path, got {list(argv)[:1]}")
    deadline = ops.clock() + wait
    while not ops.exists(serial_file):
        if ops.clock() >= deadline:
            raise ConfigError(
                f"{serial_file} did not appear in {wait:.0f}s: the driver container publishes the .nvme keyring's "
                "serial there once the kernel has it (load nvme-tcp on a node, nvmet-tcp on a storage node)"
            )
        ops.sleep(1.0)
    serial = read_serial(serial_file)
    try:
        description = ops.describe(serial)
    except OSError as exc:
        raise ConfigError(f"key {serial} from {serial_file} cannot be described: {exc.strerror}") from None
    kind, _, rest = description.partition(";")
    if kind != "keyring" or rest.rsplit(";", 1)[-1] != ".nvme":
        raise ConfigError(f"key {serial} from {serial_file} is not the .nvme keyring: {description[:80]!r}")
    try:
        ops.link(serial)
    except OSError as exc:
        raise ConfigError(f"the .nvme keyring ({serial}) cannot be linked into the session: {exc.strerror}") from None
    log.info("the .nvme keyring (%d) is linked into the session keyring; starting %s", serial, argv[0])
    ops.execv(argv[0], list(argv))
