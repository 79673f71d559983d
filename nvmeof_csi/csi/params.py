"""StorageClass parameters at the CSI edge: parsed once into :class:`VolumeParameters` (``nvmeof/parameters.py``,
the one declaration of every key), which the controller passes down. Unknown keys and bad values are refused
with INVALID_ARGUMENT naming the key; keys prefixed ``csi.storage.k8s.io/`` are the sidecars' (PV/PVC names,
secret references) and are accepted and never stored.
"""

from __future__ import annotations

from collections.abc import Mapping

from nvmeof_csi.nvmeof.parameters import VolumeParameters, mutable_parameters


def parse(params: Mapping[str, str]) -> VolumeParameters:
    """A StorageClass's parameters (CreateVolume, GetCapacity, ValidateVolumeCapabilities)."""
    return VolumeParameters.parse(params)


def mutable(params: Mapping[str, str]) -> dict[str, str]:
    """A VolumeAttributesClass's parameters: only valid per-pod I/O limits (``InvalidArgument`` otherwise)."""
    return mutable_parameters(params)
