"""The node's NVMe host identity (host NQN and host ID): found, or generated and persisted.

Contract: :func:`ensure_identity` returns the identity this node must use and makes ``/etc/nvme/hostnqn`` and
``/etc/nvme/hostid`` agree with it. Our own saved copy (in the node's state folder) wins; otherwise a valid
pair in ``/etc/nvme`` is adopted; a missing, malformed or all-zero pair (VMs without a machine UUID, cloned
images) is replaced by a fresh random one. Files are written atomically. Idempotent.

Cloned host NQNs: the saved copy is bound to this machine (a digest of ``/etc/machine-id``). A node whose
saved identity was made on another machine (a cloned disk or state folder: two nodes would share one host
NQN, and a volume published to one would be reachable from the other) gets a fresh identity instead, and the
origin says ``regenerated`` so the caller logs it loudly. Without a machine ID the binding is skipped.
"""

from __future__ import annotations

import hashlib
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


def machine_digest(machine_id: Path = Path("/etc/machine-id")) -> str:
    """A digest of this machine's ID ("" when there is none)."""
    text = _read(machine_id)
    return hashlib.sha256(f"nvmeof-csi host identity {text}".encode()).hexdigest()[:32] if text else ""


def ensure_identity(
    state_dir: Path, etc_dir: Path = Path("/etc/nvme"), machine_id: Path = Path("/etc/machine-id")
) -> tuple[HostIdentity, str]:
    """The identity to use and where it came from ("saved", "adopted", "generated" or "regenerated")."""
    saved_path = state_dir / "host-identity.json"
    doc = read_json(saved_path)
    machine = machine_digest(machine_id)
    origin = "saved"
    fields = {"nqn", "host_id"}
    identity = None
    if isinstance(doc, dict) and fields <= set(doc) <= {*fields, "machine"}:
        identity = HostIdentity(str(doc["nqn"]), str(doc["host_id"]))
    bound = str(doc.get("machine", "")) if isinstance(doc, dict) else ""
    if identity is not None and identity.valid() and machine and bound and bound != machine:
        identity, origin = HostIdentity.generate(), "regenerated"  # made on another machine: a clone
    elif identity is None or not identity.valid():
        identity = HostIdentity(_read(etc_dir / "hostnqn"), _read(etc_dir / "hostid"))
        origin = "adopted"
        if not identity.valid():
            identity, origin = HostIdentity.generate(), "generated"
    if origin != "saved" or bound != machine:
        write_atomic(saved_path, (json.dumps({**asdict(identity), "machine": machine}) + "\n").encode())
    if _read(etc_dir / "hostnqn") != identity.nqn:
        write_atomic(etc_dir / "hostnqn", (identity.nqn + "\n").encode(), mode=0o644)
    if _read(etc_dir / "hostid") != identity.host_id:
        write_atomic(etc_dir / "hostid", (identity.host_id + "\n").encode(), mode=0o644)
    return identity, origin
