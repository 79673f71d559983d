"""The kernel's ``.nvme`` keyring, where NVMe/TCP TLS pre-shared keys live on both sides, and the check that a TLS
handshake daemon (``tlshd``, from ktls-utils) runs on this machine.

The kernel makes ``.nvme`` when its NVMe keyring support is built (``CONFIG_NVME_KEYRING``, pulled in by
``CONFIG_NVME_TCP_TLS`` / ``CONFIG_NVME_TARGET_TCP_TLS``); it is not in any process's keyrings, so it is found by
name in ``/proc/keys`` and keys are added to it by serial (``add_key(2)``, key type ``psk``). Adding a key with an
existing description replaces its payload (the kernel's update semantics), so :meth:`NvmeKeyring.put_psk` is
idempotent.

Contract: :meth:`NvmeKeyring.serial` raises ``FailedPrecondition`` naming the kernel option when there is no
``.nvme`` keyring; :meth:`NvmeKeyring.put_psk` raises ``FailedPrecondition`` when the kernel refuses the key (the
key's bytes never appear in a message); :meth:`NvmeKeyring.drop_psk` unlinks every PSK of that identity from
``.nvme`` (``keyctl(KEYCTL_UNLINK)``, which needs write permission on the keyring only; a key no keyring holds
is destroyed by the kernel's key collector), returns how many, and never raises (a key that
cannot be dropped is logged: taking a grant away must not fail on it); :func:`handshake_daemon_running` looks for
a ``tlshd`` process (the caller needs the host's PID namespace).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

from nvmeof_csi.errors import FailedPrecondition

NO_KEYRING = (
    "this kernel has no .nvme keyring (NVMe/TCP TLS needs CONFIG_NVME_TCP_TLS on a node and "
    "CONFIG_NVME_TARGET_TCP_TLS on a storage node, e.g. Debian bookworm-backports' 6.12; bookworm's 6.1 lacks both)"
)
NO_DAEMON = (
    "no TLS handshake daemon runs on this machine: NVMe/TCP TLS needs tlshd (ktls-utils) in the host's "
    "network namespace, with keyrings=.nvme in tlshd.conf"
)
_SYS_ADD_KEY = 248  # x86_64
_SYS_KEYCTL = 250  # x86_64
_KEYCTL_DESCRIBE = 6
_KEYCTL_LINK = 8
_KEYCTL_UNLINK = 9
KEY_SPEC_SESSION_KEYRING = -3

AddKey = Callable[[bytes, bytes, bytes, int], int]
Unlink = Callable[[int, int], None]
log = logging.getLogger(__name__)


def _add_key(key_type: bytes, description: bytes, payload: bytes, keyring: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    serial = libc.syscall(
        _SYS_ADD_KEY,
        ctypes.c_char_p(key_type),
        ctypes.c_char_p(description),
        ctypes.c_char_p(payload),
        ctypes.c_size_t(len(payload)),
        ctypes.c_int32(keyring),
    )
    if serial < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(serial)


def _unlink(serial: int, keyring: int) -> None:
    _keyctl(_KEYCTL_UNLINK, ctypes.c_int32(serial), ctypes.c_int32(keyring))


def _keyctl(op: int, *args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    ret = int(libc.syscall(_SYS_KEYCTL, ctypes.c_int(op), *args))
    if ret < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ret


def describe_key(serial: int) -> str:
    """``type;uid;gid;perm;description`` of key ``serial`` (``KEYCTL_DESCRIBE``: view permission); ``OSError``."""
    buf = ctypes.create_string_buffer(4096)
    _keyctl(_KEYCTL_DESCRIBE, ctypes.c_int32(serial), buf, ctypes.c_size_t(len(buf)))
    return buf.value.decode(errors="replace")  # the kernel's text ends in NUL (it is truncated when longer)


def link_into_session(serial: int) -> None:
    """Link key ``serial`` into this process's session keyring (``KEYCTL_LINK``: link permission on the key, write
    on the session keyring, which its owner possesses); a child and an ``exec`` keep it; ``OSError``."""
    _keyctl(_KEYCTL_LINK, ctypes.c_int32(serial), ctypes.c_int32(KEY_SPEC_SESSION_KEYRING))


class NvmeKeyring:
    """The ``.nvme`` keyring of this machine's kernel (``proc_keys``, ``add_key`` injectable for tests)."""

    def __init__(
        self, proc_keys: Path = Path("/proc/keys"), add_key: AddKey = _add_key, unlink: Unlink = _unlink
    ) -> None:
        self._proc_keys = proc_keys
        self._add_key = add_key
        self._unlink = unlink

    def available(self) -> bool:
        try:
            self.serial()
        except FailedPrecondition:
            return False
        return True

    def serial(self) -> int:
        try:
            lines = self._proc_keys.read_text().splitlines()
        except OSError as exc:
            raise FailedPrecondition(f"{self._proc_keys}: {exc.strerror}; {NO_KEYRING}") from None
        for line in lines:
            cols = line.split(None, 8)
            if len(cols) == 9 and cols[7] == "keyring" and cols[8].split(":", 1)[0] == ".nvme":
                return int(cols[0], 16)
        raise FailedPrecondition(NO_KEYRING)

    def put_psk(self, identity: str, key: bytes) -> int:
        """Add (or replace) the PSK ``identity`` -> ``key``; its serial."""
        ring = self.serial()
        try:
            return self._add_key(b"psk", identity.encode(), key, ring)
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            raise FailedPrecondition(f"the kernel refused TLS PSK {identity!r}: {reason} ({exc.strerror})") from None

    def drop_psk(self, identity: str) -> int:
        """Unlink the PSKs named ``identity`` from ``.nvme``; how many went (0 when none, or no keyring)."""
        try:
            ring = self.serial()
            lines = self._proc_keys.read_text().splitlines()
        except (FailedPrecondition, OSError):
            return 0
        dropped = 0
        for line in lines:
            cols = line.split(None, 8)  # serial flags usage timeout perm uid gid type description: info
            if len(cols) != 9 or cols[7] != "psk" or cols[8].rsplit(": ", 1)[0] != identity:
                continue
            try:
                self._unlink(int(cols[0], 16), ring)
                dropped += 1
            except (OSError, ValueError) as exc:
                log.warning("TLS PSK %r could not be dropped from the kernel keyring: %s", identity, exc)
        return dropped


def handshake_daemon_running(proc: Path = Path("/proc")) -> bool:
    """True when a process named ``tlshd`` runs (this PID namespace)."""
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "tlshd":
                    return True
            except OSError:
                continue
    return False
