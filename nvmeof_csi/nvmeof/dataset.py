"""Dataset volumes: the StorageClass parameters that make CreateVolume fill a volume from Alluxio.

- ``dataset.uri``: the under-store location (``/srv/datasets/imagenet``, ``s3://bucket/imagenet``); mounted
  read-only into Alluxio at ``dataset.path`` when that path is not there yet
- ``dataset.path``: the data set's path in Alluxio (default ``/datasets/<hash of the uri>``)
- ``dataset.pin``: ``true`` (default) / ``false``: keep the data set cached while any volume references it
- ``dataset.ttl``: seconds after which Alluxio frees the cached data set (0 = no TTL; at most 30 days)
- ``dataset.medium``: ``MEM``, ``SSD`` or ``HDD``: the tier the data set is pinned to (default: any)

Contract: :meth:`DatasetSpec.from_parameters` returns ``None`` for an ordinary volume, a validated spec
otherwise, and raises :class:`InvalidArgument` naming the bad key; :meth:`DatasetSpec.to_parameters` is its
inverse (every key spelled out, so the spec it gives back is the same).
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument

KEYS = frozenset({"dataset.uri", "dataset.path", "dataset.pin", "dataset.ttl", "dataset.medium"})
MEDIA = ("MEM", "SSD", "HDD")
MAX_TTL_SECONDS = 30 * 86400  # a month: a cached copy nobody frees must not stay forever


@dataclass(frozen=True)
class DatasetSpec:
    path: str
    uri: str = ""
    pin: bool = True
    ttl_seconds: int = 0
    medium: str = ""

    @property
    def label(self) -> str:
        """The metrics label for this data set (its Alluxio path)."""
        return self.path

    def to_parameters(self) -> dict[str, str]:
        keys = {"dataset.path": self.path, "dataset.pin": "true" if self.pin else "false"}
        if self.uri:
            keys["dataset.uri"] = self.uri
        if self.ttl_seconds:
            keys["dataset.ttl"] = str(self.ttl_seconds)
        if self.medium:
            keys["dataset.medium"] = self.medium
        return keys

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> DatasetSpec | None:
        own = {k: v for k, v in params.items() if k.startswith("dataset.")}
        if not own:
            return None
        unknown = sorted(set(own) - KEYS)
        if unknown:
            raise InvalidArgument(f"unknown dataset parameter {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
        uri, path = own.get("dataset.uri", "").strip(), own.get("dataset.path", "").strip()
        if not uri and not path:
            raise InvalidArgument("a dataset volume needs 'dataset.uri' or 'dataset.path'")
        if not path:
            path = "/datasets/" + hashlib.sha256(uri.encode()).hexdigest()[:16]
        if not path.startswith("/") or path == "/" or ".." in path.split("/") or posixpath.normpath(path) != path:
            raise InvalidArgument(f"parameter 'dataset.path' must be an absolute Alluxio path, not {path!r}")
        pin_text = own.get("dataset.pin", "true").lower()
        if pin_text not in ("true", "false"):
            raise InvalidArgument(f"parameter 'dataset.pin' must be true or false, not {own['dataset.pin']!r}")
        try:
            ttl = int(own.get("dataset.ttl", "0"))
        except ValueError as exc:
            raise InvalidArgument(f"parameter 'dataset.ttl' must be whole seconds, not {own['dataset.ttl']!r}") from exc
        if not 0 <= ttl <= MAX_TTL_SECONDS:
            raise InvalidArgument(f"parameter 'dataset.ttl' must be within 0..{MAX_TTL_SECONDS} seconds, not {ttl}")
        medium = own.get("dataset.medium", "").upper()
        if medium and medium not in MEDIA:
            raise InvalidArgument(f"parameter 'dataset.medium' must be one of {', '.join(MEDIA)}, not {medium!r}")
        return cls(path.rstrip("/"), uri, pin_text == "true", ttl, medium)
