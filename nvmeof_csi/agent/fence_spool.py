"""DRBD's ``fence-peer`` calls, carried from the kernel to the agent through a spool folder on the storage node.

Why a spool: the kernel does not run a resource's handlers itself; it runs the DRBD module's *usermode helper*
(``/sys/module/drbd/parameters/usermode_helper``, ``/sbin/drbdadm`` by default) in the host's namespaces, as
``HELPER fence-peer RESOURCE`` (``HELPER CMD minor-N`` for a device's calls), and with ``fencing
resource-and-stonith`` keeps the resource's I/O frozen until that process exits. The agent runs in a container,
and a storage node need not have drbd-utils. So the agent points the module's helper at :data:`HELPER_NAME` in
its host folder, a POSIX ``sh`` script (:func:`helper_script`) that needs nothing but the shell: it writes one
request file into the spool and waits for the answer file holding the exit code, however long that takes (I/O
stays frozen meanwhile, as fencing asks). Requests are files, so an agent that restarts answers the ones its
predecessor left. Calls for resources that are not the driver's (not ``nv-<uuid>``) and every other helper
command are answered at once with 0, DRBD's "nothing to do" (the node's DRBD is the driver's: docs).

Exit codes (the kernel's ``conn_try_outdate_peer``): 4 "peer was fenced" (the peer's disk is now Outdated:
I/O resumes, the asker goes on as the one writer); any code outside 3-7 counts as a broken helper and leaves
I/O frozen, which is the answer for a replica the controller refused (it acknowledges nothing more).

Contract: :meth:`FenceSpool.answer_pending` answers every well-formed pending request for which ``decide``
returns a code (``None``: ask again next time, the request stays), writing the answer atomically; a malformed
request file is removed unanswered (its helper then waits for ever: only the kernel's helper writes here). It
never raises for a single request: a failing ``decide`` is logged and retried on the next call.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvmeof_csi.agent.drbd_config import resource_name
from nvmeof_csi.errors import CommandError, FailedPrecondition, InvalidArgument
from nvmeof_csi.host.atomic import write_atomic
from nvmeof_csi.host.executor import Executor

log = logging.getLogger(__name__)

HELPER_NAME = "drbd-helper"
PEER_FENCED = 4  # the peer's disk is Outdated now: I/O resumes, this replica goes on writing
STAY_FROZEN = 1  # "broken helper" to DRBD: I/O stays frozen (the controller refused this replica)
_REQUEST = re.compile(r"(fence-peer)\.(nv-[0-9a-f-]{36})\.(\d{1,10})\.req")
USERMODE_HELPER = Path("/sys/module/drbd/parameters/usermode_helper")
_SPOOL = re.compile(r"/[A-Za-z0-9/_.-]{1,200}")


@dataclass(frozen=True)
class FenceRequest:
    """One call of the kernel's helper still waiting for its answer."""

    command: str
    resource: str
    pid: int
    path: Path

    @property
    def answer(self) -> Path:
        return self.path.with_suffix(".ans")


def helper_script(spool: str) -> str:
    """The host helper's text for the spool folder ``spool`` (an absolute path of plain characters)."""
    if not _SPOOL.fullmatch(spool) or ".." in spool.split("/"):
        raise ValueError(f"spool folder {spool[:80]!r} must be an absolute path of plain characters")
    return f"""#!/bin/sh
# nvmeof-csi: DRBD's usermode helper. The kernel runs it as: drbd-helper CMD RESOURCE (or minor-N) and, with
# fencing resource-and-stonith, keeps I/O frozen until it exits. fence-peer calls for the driver's resources are
# handed to the agent through {spool}; everything else is answered 0 at once.
spool='{spool}'
[ "$1" = fence-peer ] || exit 0
case "$2" in nv-????????-????-????-????-????????????) ;; *) exit 0 ;; esac
id="$1.$2.$$"
umask 077
printf '%s %s\\n' "$1" "$2" > "$spool/.$id.tmp" && mv "$spool/.$id.tmp" "$spool/$id.req" || exit 1
while [ ! -s "$spool/$id.ans" ]; do sleep 1; done
read -r code < "$spool/$id.ans"
rm -f "$spool/$id.ans" "$spool/$id.req"
case "$code" in [0-9]|[0-9][0-9]) exit "$code" ;; *) exit 1 ;; esac
"""


def _age(path: Path) -> int:
    """A request's mtime for ordering; one its helper removed meanwhile (answered) sorts first and is skipped."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def install_helper(folder: Path, executor: Executor, param: Path = USERMODE_HELPER) -> Path:
    """The helper script in ``folder`` (on the host: the kernel runs it in the host's namespaces), its spool
    ``folder/spool``, and the DRBD module's usermode helper pointed at it (the module loaded with it, or its
    parameter rewritten when loaded already). Returns the spool. drbdmeta's lock folder (``/run/lock``) is made
    too. A module that cannot be loaded is ``FailedPrecondition`` naming it."""
    spool = folder / "spool"
    spool.mkdir(mode=0o700, parents=True, exist_ok=True)
    helper = folder / HELPER_NAME
    write_atomic(helper, helper_script(str(spool)).encode(), mode=0o755)
    Path("/run/lock").mkdir(exist_ok=True)
    try:
        if param.exists():
            param.write_text(str(helper))
        else:
            executor.run(["modprobe", "drbd", f"usermode_helper={helper}"], timeout=60)
    except (OSError, CommandError) as exc:
        raise FailedPrecondition(f"cannot point DRBD's usermode helper at {helper} (module drbd, "
                                 f"CONFIG_BLK_DEV_DRBD): {exc}") from exc  # fmt: skip
    return spool


class FenceSpool:
    def __init__(self, spool: Path, decide: Callable[[FenceRequest], int | None]) -> None:
        """``decide`` answers one request with DRBD's exit code (:data:`PEER_FENCED`, :data:`STAY_FROZEN`), or
        ``None`` when it cannot tell yet (the controller unreachable): the request waits for the next call."""
        self._spool, self._decide = spool, decide

    def pending(self) -> list[FenceRequest]:
        """Well-formed requests without an answer, oldest first; malformed request files are removed."""
        found = []
        for path in sorted(self._spool.glob("*.req"), key=_age):
            match = _REQUEST.fullmatch(path.name)
            if match is None or not self._resource_ok(match.group(2)):
                log.warning("fence spool: %r is no request of the helper; removed", path.name[:120])
                path.unlink(missing_ok=True)
                continue
            request = FenceRequest(match.group(1), match.group(2), int(match.group(3)), path)
            if path.exists() and not request.answer.exists():
                found.append(request)
        return found

    def answer(self, resource: str, pid: int, code: int) -> bool:
        """Answer the one pending request of ``resource`` from helper ``pid`` with ``code``; False when no such
        request waits (answered already, or its helper gone)."""
        for request in self.pending():
            if (request.resource, request.pid) == (resource, pid):
                write_atomic(request.answer, f"{code}\n".encode(), mode=0o600)
                log.info("fence spool: %s of %s answered %d", request.command, resource, code)
                return True
        return False

    def answer_pending(self) -> int:
        """Answer what can be answered now; how many requests were answered."""
        answered = 0
        for request in self.pending():
            try:
                code = self._decide(request)
            except Exception:  # one request's failure must not stop the others': retried on the next call
                log.exception("fence spool: deciding %s of %s failed; asking again", request.command, request.resource)
                continue
            if code is None:
                continue
            write_atomic(request.answer, f"{code}\n".encode(), mode=0o600)
            log.info("fence spool: %s of %s answered %d", request.command, request.resource, code)
            answered += 1
        return answered

    @staticmethod
    def _resource_ok(resource: str) -> bool:
        try:
            return resource_name(resource.removeprefix("nv-")) == resource
        except InvalidArgument:
            return False
