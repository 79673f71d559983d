"""StorageClass parameters -> typed options. Unknown keys are rejected with INVALID_ARGUMENT naming them.

Keys prefixed ``csi.storage.k8s.io/`` are added by the Kubernetes sidecars (PV/PVC names, secret
references); they are accepted and not stored with the volume. Every other key must be ``transport``,
``auth`` (DH-HMAC-CHAP: ``none``, ``dhchap``, ``dhchap-bidirectional``), ``tls`` (NVMe/TCP TLS 1.3: ``none``,
``psk``; ``transport: tcp`` only), a per-pod I/O limit
(``nvmeof_csi.nvmeof.qos``), one of the connection tunables
(``nvmeof_csi.nvmeof.context.TUNABLES``, range-checked there) or a ``dataset.*`` key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.context import TUNABLE_KEYS, check_auth, check_transport, tunables_from
from nvmeof_csi.nvmeof.qos import QOS_KEY_NAMES, limits_from, mutable_only
from nvmeof_csi.nvmeof.tlspsk import check_tls
from nvmeof_csi.service.datasets import KEYS as DATASET_KEYS
from nvmeof_csi.service.datasets import DatasetSpec

SIDECAR_PREFIX = "csi.storage.k8s.io/"
KNOWN = frozenset({"transport", "auth", "tls", *TUNABLE_KEYS, *QOS_KEY_NAMES, *DATASET_KEYS})


@dataclass(frozen=True)
class VolumeOptions:
    """Parsed StorageClass parameters; ``None`` means "use the driver default"."""

    transport: str = "tcp"
    ints: tuple[tuple[str, int], ...] = ()
    auth: str = "none"
    tls: str = "none"

    def get(self, key: str) -> int | None:
        return dict(self.ints).get(key)


def stored_parameters(params: Mapping[str, str]) -> dict[str, str]:
    """The parameters recorded with a volume (sidecar-added keys dropped)."""
    return {k: v for k, v in params.items() if not k.startswith(SIDECAR_PREFIX)}


def mutable(params: Mapping[str, str]) -> dict[str, str]:
    """The mutable parameters of a VolumeAttributesClass (CreateVolume's ``mutable_parameters``, ModifyVolume's):
    sidecar-added keys dropped, every other key a valid per-pod I/O limit (``InvalidArgument`` otherwise)."""
    own = stored_parameters(params)
    mutable_only(own)
    return own


def parse(params: Mapping[str, str]) -> VolumeOptions:
    own = stored_parameters(params)
    unknown = sorted(set(own) - KNOWN)
    if unknown:
        raise InvalidArgument(f"unknown StorageClass parameter {unknown[0]!r} (known: {', '.join(sorted(KNOWN))})")
    DatasetSpec.from_parameters(own)  # validates the dataset.* keys of a dataset volume
    limits_from(own)  # validates the per-pod I/O limits
    tls = check_tls(own.get("tls", "none"))
    transport = check_transport(own.get("transport", "tcp"))
    if tls != "none" and transport != "tcp":
        raise InvalidArgument(f"parameter 'tls: {tls}' is for transport tcp only (NVMe/TCP TLS), not {transport}")
    return VolumeOptions(transport, tunables_from(own), check_auth(own.get("auth", "none")), tls)
