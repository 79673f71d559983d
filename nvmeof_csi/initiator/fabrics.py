"""The kernel's NVMe-oF connect interface, ``/dev/nvme-fabrics``, used for connects that carry DH-HMAC-CHAP
keys: written straight to the kernel, a key never appears on a command line (``/proc/<pid>/cmdline`` is
readable by every local user) nor in an error message.

Contract: :meth:`FabricsDevice.options` lists the connect options this kernel parses (6.1 lists
``dhchap_secret`` even when built without authentication); :meth:`FabricsDevice.authenticates` is True only
when the kernel can do DH-HMAC-CHAP as a host (the ``nvme-auth`` module is loaded or built in, which
``CONFIG_NVME_HOST_AUTH`` needs); :meth:`FabricsDevice.connect` writes one
``key=value`` option string and returns the new controller's instance name (``nvme3``), or raises
:class:`FabricsError` carrying the errno (``EALREADY``: the same controller exists; ``EKEYREJECTED``:
authentication failed). Option values must not contain ``,`` or ``=`` (``InvalidArgument``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from nvmeof_csi.errors import InvalidArgument

DEVICE = Path("/dev/nvme-fabrics")


class FabricsError(OSError):
    """A connect the kernel refused; ``str()`` names the errno, never the options written."""


class FabricsDevice:
    def __init__(
        self, path: Path = DEVICE, sys_root: Path = Path("/sys"), modules: Path = Path("/lib/modules")
    ) -> None:
        self._path = path
        self._sys = sys_root
        self._modules = modules

    def authenticates(self) -> bool:
        """True when this kernel's NVMe host can authenticate (nvme-auth loaded, or built in)."""
        if (self._sys / "module" / "nvme_auth").is_dir():
            return True
        try:
            builtin = (self._modules / os.uname().release / "modules.builtin").read_text()
        except OSError:
            return False
        return any(line.endswith("/nvme-auth.ko") for line in builtin.splitlines())

    def options(self) -> frozenset[str]:
        """Option names this kernel's fabrics layer accepts (empty when the device cannot be read)."""
        try:
            text = self._path.read_text()
        except OSError:
            return frozenset()
        return frozenset(item.split("=", 1)[0] for item in text.strip().split(",") if item)

    def connect(self, options: Sequence[tuple[str, str | None]]) -> str:
        """Create one controller; ``None`` values are flags (e.g. ``duplicate_connect``)."""
        parts = []
        for name, value in options:
            if any(c in f"{name}{value or ''}" for c in ",=\n\0"):
                raise InvalidArgument(f"connect option {name!r} has a character the kernel cannot take")
            parts.append(name if value is None else f"{name}={value}")
        try:
            fd = os.open(self._path, os.O_RDWR)
        except OSError as exc:
            raise FabricsError(exc.errno, f"open {self._path}: {os.strerror(exc.errno or 0)}") from None
        try:
            os.write(fd, ",".join(parts).encode())
            reply = os.read(fd, 4096).decode(errors="replace")
        except OSError as exc:  # the message must not carry the option string (keys)
            code = exc.errno or errno.EIO
            raise FabricsError(code, f"{errno.errorcode.get(code, code)}: {os.strerror(code)}") from None
        finally:
            os.close(fd)
        fields = dict(item.split("=", 1) for item in reply.strip().split(",") if "=" in item)
        return f"nvme{fields.get('instance', '?')}"
