"""Per-pod I/O limits of a volume: the ONE table of QoS keys (StorageClass / VolumeAttributesClass parameter,
cgroup v2 ``io.max`` field, range) that parameter validation, the volume context and the node read. No I/O.

The kernel's nvmet target has no per-namespace QoS, so the limit is applied where the I/O is issued: the
node writes ``io.max`` of the pod's cgroup for the volume's native-multipath head disk.

Contract:
- :func:`limits_from` reads the QoS keys of ``values`` (other keys are ignored); ``0`` or ``max`` means
  unlimited; anything else must be an integer within the key's range (``InvalidArgument`` naming the key).
- :meth:`QosLimits.io_max_line` is what ``io.max`` takes for one device; an unlimited field is ``max``, so
  writing the line of :data:`UNLIMITED` removes the device's entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument


@dataclass(frozen=True)
class QosKey:
    key: str  # StorageClass / VolumeAttributesClass parameter and volume-context key
    field: str  # the io.max field
    high: int
    meaning: str
    kind: str  # the metric label (nvmeof_csi_volume_qos_limit{kind=...})


QOS_KEYS: tuple[QosKey, ...] = (
    QosKey("readIops", "riops", 100_000_000, "read I/Os per second", "read_iops"),
    QosKey("writeIops", "wiops", 100_000_000, "write I/Os per second", "write_iops"),
    QosKey("readBps", "rbps", 1 << 44, "bytes read per second", "read_bps"),
    QosKey("writeBps", "wbps", 1 << 44, "bytes written per second", "write_bps"),
)
QOS_KEY_NAMES = tuple(k.key for k in QOS_KEYS)
UNLIMITED_WORDS = ("0", "max")


@dataclass(frozen=True)
class QosLimits:
    """Limits by key; a key that is absent is unlimited."""

    values: tuple[tuple[str, int], ...] = ()

    @property
    def limited(self) -> bool:
        return bool(self.values)

    def get(self, key: str) -> int | None:
        return dict(self.values).get(key)

    def io_max_fields(self) -> dict[str, str]:
        """``{"riops": "500", "wiops": "max", ...}``: every field, ``max`` where unlimited."""
        return {k.field: str(self.get(k.key) or "max") for k in QOS_KEYS}

    def io_max_line(self, major_minor: str) -> str:
        return " ".join([major_minor, *(f"{f}={v}" for f, v in self.io_max_fields().items())])

    def to_context(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.values}


UNLIMITED = QosLimits()


def immutable(values: Mapping[str, str]) -> dict[str, str]:
    """``values`` without the mutable keys (what must match for an idempotent CreateVolume)."""
    return {k: v for k, v in values.items() if k not in QOS_KEY_NAMES}


def mutable_only(values: Mapping[str, str]) -> QosLimits:
    """Checks that every key of ``values`` is a mutable (QoS) key with a valid value: ``InvalidArgument``
    naming the first other key. Returns the limits."""
    other = sorted(set(values) - set(QOS_KEY_NAMES))
    if other:
        raise InvalidArgument(f"parameter {other[0][:80]!r} is not mutable (mutable: {', '.join(QOS_KEY_NAMES)})")
    return limits_from(values)


def limits_from(values: Mapping[str, str]) -> QosLimits:
    found = []
    for qos in QOS_KEYS:
        if qos.key not in values:
            continue
        text = str(values[qos.key]).strip()
        if text in UNLIMITED_WORDS:
            continue
        try:
            value = int(text)
        except ValueError as exc:
            raise InvalidArgument(f"parameter {qos.key!r} must be an integer, 0 or 'max', not {text[:40]!r}") from exc
        if not 1 <= value <= qos.high:
            raise InvalidArgument(
                f"parameter {qos.key!r} must be within 1..{qos.high} (or 0/max: unlimited), not {value}"
            )
        found.append((qos.key, value))
    return QosLimits(tuple(found))
