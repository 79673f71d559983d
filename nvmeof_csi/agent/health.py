"""What is wrong with one volume on this target, read from the kernel and the pool (no writes).

Contract: :func:`volume_health` returns ``(status, reason, message)`` triples (status ``degraded``,
``inaccessible`` or ``data-loss``; reason CamelCase, unique per status), empty when nothing is known to be
wrong: the volume not ready (being filled or deleted), its backing file missing (data loss), its subsystem or
namespace missing or disabled, ports of its kind (TLS or clear text) it should be linked to but is not (some:
degraded, all: inaccessible), and a pool below :data:`POOL_LOW` free (thin volumes may fail writes). A replica
(``agent/replicas.py``): its namespace disabled on a secondary, fenced or handing-over replica and its portals
unlinked on a fenced or handing-over one are by design, not issues; a primary whose peer is not in sync is
degraded with DRBD's view (``1 of 2 replicas in sync: resyncing 43%``).
"""

from __future__ import annotations

from nvmeof_csi.agent.drbd_status import replica_health
from nvmeof_csi.agent.parts import NSID, AgentParts, portals_for
from nvmeof_csi.agent.replica_spec import FENCED, HANDOVER, PRIMARY
from nvmeof_csi.agent.state import READY, VolumeRecord
from nvmeof_csi.nvmeof.nqn import volume_nqn

DEGRADED, INACCESSIBLE, DATA_LOSS = "degraded", "inaccessible", "data-loss"
POOL_LOW = 0.05
Issue = tuple[str, str, str]


def volume_health(parts: AgentParts, rec: VolumeRecord) -> list[Issue]:
    if rec.status != READY:
        return [(DEGRADED, "VolumeNotReady", f"volume is {rec.status} on agent {parts.name}")]
    issues: list[Issue] = []
    path = parts.store.volume_path(rec.uuid)
    if not path.is_file():
        issues.append((DATA_LOSS, "BackingFileMissing", f"backing file {path} is missing on agent {parts.name}"))
    nqn = volume_nqn(rec.uuid)
    nvmet = parts.nvmet
    if not nvmet.has_subsystem(nqn):
        issues.append((INACCESSIBLE, "SubsystemMissing", f"subsystem {nqn} is missing from configfs"))
        return issues
    role = rec.replica.get("role", "") if rec.replica else ""
    present = NSID in nvmet.namespaces(nqn)
    if not present or (role in ("", PRIMARY) and not nvmet.namespace_enabled(nqn, NSID)):  # else: by design
        issues.append((INACCESSIBLE, "NamespaceDisabled", f"namespace {NSID} of {nqn} is missing or disabled"))
    if role == PRIMARY and parts.replication is not None:
        line = replica_health(parts.replication.state(rec))
        if line is not None:
            issues.append((DEGRADED, "ReplicaNotInSync", line))
    if role in (FENCED, HANDOVER):  # its portals are unlinked by design: fenced, or handing over to its peer
        return issues + _pool(parts)
    own = portals_for(rec, parts.portals)  # a TLS volume's portals are the TLS ones, a clear volume's the others
    unlinked = [p for p in own if nqn not in nvmet.linked(p.port_id)]
    if unlinked and len(unlinked) == len(own):
        issues.append((INACCESSIBLE, "NoPortLinked", f"{nqn} is linked to none of the agent's ports"))
    elif unlinked:
        names = ", ".join(f"{p.trtype}:{p.traddr}:{p.trsvcid}" for p in unlinked)
        issues.append((DEGRADED, "PortUnlinked", f"{nqn} is not linked to port(s) {names}"))
    return issues + _pool(parts)


def _pool(parts: AgentParts) -> list[Issue]:
    pool = parts.store.usage()
    if pool.total_bytes and pool.free_bytes < POOL_LOW * pool.total_bytes:
        message = (
            f"pool of agent {parts.name} has {pool.free_bytes} of {pool.total_bytes} bytes free: thin volumes may "
            "fail writes"
        )
        return [(DEGRADED, "PoolNearlyFull", message)]
    return []
