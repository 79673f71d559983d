"""CSI 1.13 volume-health messages from the service layer's :class:`Condition` (shared by the controller and
the node services). No I/O."""

from __future__ import annotations

from nvmeof_csi.gen import csi_pb2
from nvmeof_csi.service.contracts import Condition

_STATUS = {
    "degraded": csi_pb2.DEGRADED,
    "inaccessible": csi_pb2.INACCESSIBLE,
    "data-loss": csi_pb2.DATA_LOSS,
}


def volume_health(volume_id: str, condition: Condition) -> csi_pb2.VolumeHealth:
    """``VolumeHealth`` with one entry per (status, reason) of the condition's problems; none when healthy."""
    entries, seen = [], set()
    for problem in condition.issues():
        key = (problem.status, problem.reason)
        if key in seen:  # the spec forbids two entries with the same (status, reason)
            continue
        seen.add(key)
        entries.append(
            csi_pb2.VolumeHealth.VolumeHealthEntry(
                status=_STATUS.get(problem.status, csi_pb2.UNKNOWN_VOLUME_HEALTH_TYPE),
                reason=problem.reason,
                message=problem.message,
            )
        )
    return csi_pb2.VolumeHealth(volume_id=volume_id, health_statuses=entries)
