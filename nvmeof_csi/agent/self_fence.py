"""A replica that lost its peer and cannot reach the arbiter stops serving hosts (the old primary of a partition).

DRBD froze the replica's I/O when it lost its peer (``fencing resource-and-stonith``) and its fence-peer call waits
for the controller (``agent/fence_spool.py``). The controller answers within about a second; a call that waits
much longer means the controller is gone or cut off from this node, and may meanwhile promote the peer
(``service/failover.py``). Frozen I/O acknowledges nothing, but the hosts' paths here stay LIVE with their I/O
queued on them; :meth:`SelfFence.run_once` unlinks every portal of such a volume, so the hosts' controllers here
go to CONNECTING and their I/O moves to the other node's paths once it is promoted. The namespace stays enabled
(a host deletes its multipath head when the last path's namespace goes).

Contract: a volume is self-fenced once its oldest waiting call is at least ``after`` seconds old (``after`` well
below the controller's failover grace); :meth:`SelfFence.resume` links its portals again when the controller
answers "peer fenced" (this replica goes on as the one writer) and the replica is still primary. Anything else
(refused, a newer epoch's role) leaves them to the controller's role changes. A restarted agent links a
primary's portals at converge and the next pass unlinks them again while the call still waits.
"""

from __future__ import annotations

import logging
import threading

from nvmeof_csi.agent.parts import AgentParts
from nvmeof_csi.agent.replica_ops import unlink_everywhere
from nvmeof_csi.agent.replica_spec import PRIMARY, ReplicaSpec
from nvmeof_csi.nvmeof.nqn import volume_nqn
from nvmeof_csi.rpc.background import every

log = logging.getLogger(__name__)


class SelfFence:
    def __init__(self, parts: AgentParts, after: float = 5.0) -> None:
        self._p, self._after = parts, after
        self._fenced: set[str] = set()
        self._lock = threading.Lock()

    def run(self, stop: threading.Event, period: float = 1.0) -> None:
        """A pass every ``period`` seconds until ``stop`` (the agent's background loop)."""
        every(period, self.run_once, "self-fence")(stop)

    def run_once(self) -> list[str]:
        """Self-fence every volume whose fence-peer call has waited ``after`` seconds; the volumes fenced now."""
        rep, now = self._p.replication, self._p.clock()
        if rep is None:
            return []
        fenced = []
        for request in rep.fence_requests():
            vol = request.resource.removeprefix("nv-")
            try:
                waited = now - request.path.stat().st_mtime
            except FileNotFoundError:  # answered meanwhile
                continue
            with self._lock:
                if waited < self._after or vol in self._fenced:
                    continue
                self._fenced.add(vol)
            with self._p.keys.hold(vol):
                if vol not in self._p.state.current.volumes:
                    continue
                unlink_everywhere(self._p, volume_nqn(vol))
            log.warning(
                "volume %s: DRBD lost the peer and the controller has not answered for %.0f s: every portal "
                "unlinked (self-fenced); hosts move to the other node once it is promoted",
                vol,
                waited,
            )
            fenced.append(vol)
        return fenced

    def resume(self, vol_uuid: str) -> bool:
        """The controller answered "peer fenced": a self-fenced primary links its portals again."""
        with self._lock:
            if vol_uuid not in self._fenced:
                return False
            self._fenced.discard(vol_uuid)
        with self._p.keys.hold(vol_uuid):
            rec = self._p.state.current.volumes.get(vol_uuid)
            if rec is None or not rec.replica or ReplicaSpec.parse(rec.replica).role != PRIMARY:
                return False
            self._p.export(rec, volume_nqn(vol_uuid), self._p.writers(rec))
        log.info("volume %s: the controller answered: portals linked again (the one writer)", vol_uuid)
        return True


__all__ = ["SelfFence"]
