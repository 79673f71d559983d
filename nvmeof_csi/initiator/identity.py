"""The node's NVMe host identity (host NQN and host ID): found, or generated and persisted.

Contract: :func:`ensure_identity` returns the identity this node must use and makes ``/etc/nvme/hostnqn`` and
``/etc/nvme/hostid`` agree with it. Our own saved copy (in the node's state folder) wins; otherwise a valid
pair in ``/etc/nvme`` is adopted; a missing, malformed or all-zero pair (VMs without a machine UUID, cloned
images) is replaced by a fresh random one. Files are written atomically. Idempotent.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from nvmeof_csi.host.atomic import read_json, write_atomic
from nvmeof_csi.nvmeof.nqn import UUID_NQN_PREFIX, uuid_nqn, valid_host_nqn

ZERO = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class HostIdentity:
    nqn: str
    host_id: str

    def valid(self) -> bool:
        try:
            parsed = str(uuid.UUID(self.host_id))
        except ValueError:
            return False
        if parsed == ZERO or not valid_host_nqn(self.nqn) or self.nqn.endswith(ZERO):
            return False
        return not self.nqn.startswith(UUID_NQN_PREFIX) or self.nqn == uuid_nqn(parsed)

    @classmethod
    def generate(cls) -> HostIdentity:
        host_id = str(uuid.uuid4())
        return cls(uuid_nqn(host_id), host_id)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def ensure_identity(state_dir: Path, etc_dir: Path = Path("/etc/nvme")) -> tuple[HostIdentity, str]:
    """The identity to use and where it came from ("saved", "adopted" or "generated")."""
    saved_path = state_dir / "host-identity.json"
    doc = read_json(saved_path)
    origin = "saved"
    identity = HostIdentity(**doc) if isinstance(doc, dict) and set(doc) == {"nqn", "host_id"} else None
    if identity is None or not identity.valid():
        identity = HostIdentity(_read(etc_dir / "hostnqn"), _read(etc_dir / "hostid"))
        origin = "adopted"
        if not identity.valid():
            identity, origin = HostIdentity.generate(), "generated"
        write_atomic(saved_path, (json.dumps(asdict(identity)) + "\n").encode())
    if _read(etc_dir / "hostnqn") != identity.nqn:
        write_atomic(etc_dir / "hostnqn", (identity.nqn + "\n").encode(), mode=0o644)
    if _read(etc_dir / "hostid") != identity.host_id:
        write_atomic(etc_dir / "hostid", (identity.host_id + "\n").encode(), mode=0o644)
    return identity, origin
