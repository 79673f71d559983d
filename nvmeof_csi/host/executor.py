"""Running host commands: argv lists with timeouts, never a shell.

Contract: :meth:`Executor.run` runs ``argv`` with a timeout (seconds), returns a :class:`Result`, and with
``check=True`` raises :class:`~nvmeof_csi.errors.CommandError` on a non-zero exit or a timeout (rc -9).
Strings listed in ``secrets`` are replaced by ``***`` in the argv kept in errors and logs. Thread-safe; no
state between calls.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nvmeof_csi.errors import CommandError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What a finished command returned."""

    rc: int
    out: str
    err: str


def redact(argv: Sequence[str], secrets: Sequence[str]) -> list[str]:
    """Return ``argv`` with every occurrence of a secret replaced by ``***``."""
    out = []
    for arg in argv:
        shown = arg
        for secret in secrets:
            if secret:
                shown = shown.replace(secret, "***")
        out.append(shown)
    return out


class Executor(Protocol):
    """Runs commands. Implementations: :class:`SubprocessExecutor`; fakes in tests."""

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        check: bool = True,
        stdin: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Result: ...


class SubprocessExecutor:
    """The real executor: :func:`subprocess.run` with an argv list and a timeout."""

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        check: bool = True,
        stdin: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Result:
        shown = redact(argv, secrets)
        try:
            proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            raise CommandError(shown, -9, out, f"timed out after {timeout:g} s") from exc
        except FileNotFoundError as exc:
            raise CommandError(shown, 127, "", f"command not found: {argv[0]}") from exc
        except PermissionError as exc:  # also raised when a PATH folder cannot be searched and the tool is absent
            if shutil.which(argv[0]) is None:
                raise CommandError(shown, 127, "", f"command not found: {argv[0]}") from exc
            raise CommandError(shown, 126, "", f"command not executable: {argv[0]}") from exc
        result = Result(proc.returncode, proc.stdout, proc.stderr)
        log.debug("ran %s rc=%d", " ".join(shown), proc.returncode)
        if check and proc.returncode != 0:
            raise CommandError(shown, proc.returncode, proc.stdout, proc.stderr)
        return result
