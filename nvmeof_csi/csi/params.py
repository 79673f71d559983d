"""StorageClass parameters -> typed options. Unknown keys are rejected with INVALID_ARGUMENT naming them.

Keys prefixed ``csi.storage.k8s.io/`` are added by the Kubernetes sidecars (PV/PVC names, secret
references); they are accepted and not stored with the volume. Every other key must be one of
:data:`KNOWN`; the integer tunables are range-checked so a typo cannot hang a node (e.g. an infinite
``ctrlLossTmo``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.service.datasets import KEYS as DATASET_KEYS
from nvmeof_csi.service.datasets import DatasetSpec

SIDECAR_PREFIX = "csi.storage.k8s.io/"

#: key -> (min, max) for integer tunables (seconds, counts).
INT_RANGES: dict[str, tuple[int, int]] = {
    "ctrlLossTmo": (1, 3600),
    "reconnectDelay": (1, 600),
    "fastIoFailTmo": (0, 3600),
    "keepAliveTmo": (1, 600),
    "nrIoQueues": (1, 128),
    "queueSize": (16, 1024),
    "tos": (0, 255),
}
TRANSPORTS = ("tcp", "rdma")
KNOWN = frozenset({"transport", *INT_RANGES, *DATASET_KEYS})


@dataclass(frozen=True)
class VolumeOptions:
    """Parsed StorageClass parameters; ``None`` means "use the driver default"."""

    transport: str = "tcp"
    ints: tuple[tuple[str, int], ...] = ()

    def get(self, key: str) -> int | None:
        return dict(self.ints).get(key)


def stored_parameters(params: Mapping[str, str]) -> dict[str, str]:
    """The parameters recorded with a volume (sidecar-added keys dropped)."""
    return {k: v for k, v in params.items() if not k.startswith(SIDECAR_PREFIX)}


def parse(params: Mapping[str, str]) -> VolumeOptions:
    own = stored_parameters(params)
    unknown = sorted(set(own) - KNOWN)
    if unknown:
        raise InvalidArgument(
            f"unknown StorageClass parameter {unknown[0]!r} (known: {', '.join(sorted(KNOWN))})"
        )
    DatasetSpec.from_parameters(own)  # validates the dataset.* keys of a dataset volume
    transport = own.get("transport", "tcp")
    if transport not in TRANSPORTS:
        raise InvalidArgument(f"parameter 'transport' must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    ints = []
    for key, (low, high) in INT_RANGES.items():
        if key not in own:
            continue
        try:
            value = int(own[key])
        except ValueError as exc:
            raise InvalidArgument(f"parameter {key!r} must be an integer, not {own[key]!r}") from exc
        if not low <= value <= high:
            raise InvalidArgument(f"parameter {key!r} must be within {low}..{high}, not {value}")
        ints.append((key, value))
    return VolumeOptions(transport, tuple(ints))
