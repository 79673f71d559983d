"""Fencing on the target agent: a host that lost its node (or was cut off from the control plane) loses a volume
*now*, not at its next connect.

nvmet checks ``allowed_hosts`` only when a host connects: a controller that is already connected keeps reading
and writing after its host leaves the list. The kernels we serve (Debian's 6.1 and 6.12) are built without
``CONFIG_NVME_TARGET_DEBUGFS``, so one controller cannot be ended by itself; what ends controllers is dropping a
port's link to the subsystem, which deletes every controller of that subsystem on that port (the kernel shuts
their queues: no further command is read from them). So a fence, per volume and host:

1. records the fence and removes the host from the volume's grants, in one durable commit;
2. removes the host from the subsystem's ``allowed_hosts`` (its reconnects are refused from now on);
3. on each port the subsystem is linked to, one port at a time, drops the link and makes it again: the fenced
   host's controllers end, the volume's other hosts (ReadOnlyMany, shared block) see that path reset and
   reconnect to it (their multipath keeps I/O on the other port meanwhile; while other hosts remain, the
   volume's ``reconnectDelay`` + 1 s between ports gives them the time to);
4. marks the fence done.

Contract: :meth:`FenceOps.fence_host` is idempotent (a done fence returns at once; one not done finishes) and
holds the volume's and the host's keys; :meth:`FenceOps.resume` finishes at start-up every fence a killed agent
left between steps 1 and 4. A fenced host cannot be allowed again (``AllowHost`` is ``FailedPrecondition``, see
``agent/hosts.py``) until :meth:`FenceOps.unfence_host`, which allows nothing by itself.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from nvmeof_csi.agent.parts import AgentParts, VolumeView
from nvmeof_csi.agent.readonly_exports import ReadOnlyExports
from nvmeof_csi.agent.state import FenceMark, VolumeRecord
from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.nqn import readonly_nqn, volume_nqn

log = logging.getLogger(__name__)
REASON = re.compile(r"[A-Z_]{1,64}")
BOOT_ID = re.compile(r"[0-9a-fA-F-]{0,64}")
DEFAULT_RECONNECT_DELAY, MAX_PAUSE = 2, 30


def check_fence(reason: str, boot_id: str) -> None:
    if not REASON.fullmatch(reason):
        raise InvalidArgument(f"fence reason {reason[:80]!r} must be 1 to 64 of A-Z and _")
    if not BOOT_ID.fullmatch(boot_id):
        raise InvalidArgument("boot_id must be at most 64 hexadecimal digits and dashes")


def pause(rec: VolumeRecord) -> float:
    """Seconds between two ports of a fence while other hosts remain: their reconnect delay and one more."""
    try:
        delay = rec.options.tunable("reconnectDelay") or DEFAULT_RECONNECT_DELAY
    except ValueError:
        delay = DEFAULT_RECONNECT_DELAY
    return float(min(max(delay, 1), MAX_PAUSE) + 1)


class FenceOps:
    def __init__(self, parts: AgentParts, sleep: Callable[[float], None] = time.sleep) -> None:
        self._p, self._sleep = parts, sleep

    def fence_host(self, vol_uuid: str, host_nqn: str, reason: str, boot_id: str = "") -> VolumeView:
        p = self._p
        check_fence(reason, boot_id)
        with p.holding(vol_uuid, host_nqn) as found:
            rec = found
            mark = rec.fenced.get(host_nqn)
            if mark is None:
                mark = FenceMark(reason=reason, at=p.clock(), boot_id=boot_id, done=False)
                rec = p.state.put_volume(rec.without_host(host_nqn).evolve(fenced={**rec.fenced, host_nqn: mark}))
            if not mark["done"]:
                rec = self._finish(rec, host_nqn, mark)
            return p.view(rec)

    def _finish(self, rec: VolumeRecord, host_nqn: str, mark: FenceMark) -> VolumeRecord:
        """Steps 2 to 4 for a recorded fence (the caller holds the volume's and the host's keys)."""
        p = self._p
        present = [n for n in (volume_nqn(rec.uuid), readonly_nqn(rec.uuid)) if p.nvmet.has_subsystem(n)]
        # the subsystem(s) the host is allowed on (read-write or read-only); all of them when a crash came after
        # the grant went, so that nothing it may still hold is missed
        nqns = [n for n in present if host_nqn in p.nvmet.allowed_hosts(n)] or present
        for nqn in nqns:
            p.nvmet.deny(nqn, host_nqn)
        if readonly_nqn(rec.uuid) in nqns and not rec.readonly_hosts:
            ReadOnlyExports(p).remove(rec)  # the read-only subsystem goes with its last host
        p.nvmet.remove_host(host_nqn)
        p.drop_psks(rec, [host_nqn])
        others = bool(rec.hosts)  # the other hosts reconnect on each port cycled before the next goes
        ended = p.cycle_links(nqns, (lambda: self._sleep(pause(rec))) if others else (lambda: None))
        rec = p.state.put_volume(rec.evolve(fenced={**rec.fenced, host_nqn: FenceMark(**{**mark, "done": True})}))
        log.warning(
            "fenced host %s from volume %s (%s): not allowed; its controllers ended on ports %s; %d other host(s)",
            host_nqn,
            rec.uuid,
            mark["reason"],
            ended,
            len(rec.hosts),
        )
        return rec

    def unfence_host(self, vol_uuid: str, host_nqn: str) -> VolumeView:
        p = self._p
        with p.holding(vol_uuid, host_nqn) as found:
            rec = found
            if host_nqn in rec.fenced:
                rec = p.state.put_volume(rec.evolve(fenced={k: v for k, v in rec.fenced.items() if k != host_nqn}))
                log.warning("unfenced host %s on volume %s (it may be allowed again)", host_nqn, vol_uuid)
            return p.view(rec)

    def resume(self) -> list[str]:
        """Finish every fence left undone by a killed agent; returns ``volume/host`` of each."""
        finished = []
        for rec in self._p.live_volumes():
            for host, mark in rec.fenced.items():
                if not mark["done"]:
                    self.fence_host(rec.uuid, host, mark["reason"], mark["boot_id"])
                    finished.append(f"{rec.uuid}/{host}")
        return finished
