"""NodeUnstage of a volume whose staging record was set aside (quarantined: unreadable, or a context the connector
cannot use). Without it, unstage was a silent success that left the staging mount and the connections in place,
and the volume could be staged elsewhere while this node still held it.

Contract: :func:`unstage_by_id` unmounts ``staging_path`` only when what is mounted there is the volume's own
device (found by the volume ID alone, ``Connector.head_of``): a path the driver cannot tie to the volume is never
touched. Then it disconnects the volume's connections by its ID (``Connector.release_volume``), never one whose
device is still in use (published to a pod: ``FailedPrecondition`` naming it, kubelet retries after unpublish)
nor one another staged volume shares. Idempotent; the set-aside record stays for the operator.
"""

from __future__ import annotations

import logging

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.service.contracts import Connector, VolumeRef

log = logging.getLogger(__name__)


def unstage_by_id(
    connector: Connector, mounter: Mounter, ref: VolumeRef, staging_path: str, in_use: frozenset[VolumeRef]
) -> None:
    device = connector.head_of(ref)
    mount = mounter.mount_at(staging_path)
    if mount is not None and device is not None and mount.source == device:
        mounter.unmount(staging_path)
    actions = connector.release_volume(ref, in_use)
    kept = [a for a in actions if a.startswith("kept ")]
    if kept:
        raise FailedPrecondition(f"volume {ref.uuid} (staging record set aside): {'; '.join(kept)}")
    log.warning("volume %s unstaged by its ID (its staging record was set aside): %s", ref.uuid, actions or "none")
