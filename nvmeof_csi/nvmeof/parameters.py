"""StorageClass parameters: the ONE declaration of every key (:data:`PARAMETERS`, which docs/configuration.md's
table is made from) and the typed value a volume's parameters become (:class:`VolumeParameters`). No I/O.

Parameters are parsed once where they enter a process: the CSI controller's CreateVolume (the StorageClass),
the agent's gRPC API (what a controller sent) and a stored record (what an agent or the loop backend saved).
Every layer below takes :class:`VolumeParameters`, never the string map.

Contract:
- :meth:`VolumeParameters.parse` drops the sidecars' ``csi.storage.k8s.io/`` keys and refuses an unknown key or
  a bad value with ``InvalidArgument`` naming the key (ranges: ``nvmeof/context.py``'s ``TUNABLES``,
  ``nvmeof/qos.py``'s ``QOS_KEYS``, ``nvmeof/dataset.py``).
- :meth:`VolumeParameters.to_map` is its inverse: ``parse(p.to_map()) == p`` for every ``p`` (the map is how a
  volume's parameters travel to an agent and are stored there).
- Equality is by meaning: ``{"readIops": "max"}`` and ``{}``, or ``{"transport": "tcp"}`` and ``{}``, are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.context import AUTH_MODES, TRANSPORTS, TUNABLES, check_auth, check_transport, tunables_from
from nvmeof_csi.nvmeof.dataset import MAX_TTL_SECONDS, MEDIA, DatasetSpec
from nvmeof_csi.nvmeof.qos import QOS_KEY_NAMES, QOS_KEYS, UNLIMITED, QosLimits, limits_from, mutable_only
from nvmeof_csi.nvmeof.tlspsk import TLS_MODES, check_tls

SIDECAR_PREFIX = "csi.storage.k8s.io/"
REPLICAS: tuple[str | bool, ...] = ("1", "2")


@dataclass(frozen=True)
class Parameter:
    """One StorageClass key: what it takes and what it does (a row of docs/configuration.md's table)."""

    key: str
    values: str
    meaning: str
    mutable: bool = False  # may change later through a VolumeAttributesClass (ControllerModifyVolume)


#: What the docs add to a tunable's own one-line meaning (measurements and advice).
_TUNABLE_NOTES = {
    "ctrlLossTmo": "bounded, so a reboot never hangs",
    "fastIoFailTmo": "default off: I/O waits for the path",
    "keepAliveTmo": (
        "the kernel's own default. A silently dead path (no RST, no ICMP) stalls I/O for up to about 1.5 x this + "
        "1 s before it moves to another path: measured 2.9-3.3 s at 2 s and 7.4-8.3 s at 5 s (`bench/pathloss.py`); "
        "the kernel notices a dead link only when a keep-alive command goes unanswered for `keepAliveTmo`, and "
        "keep-alives are sent periodically, not the moment traffic stops. Lower it for faster failover on a quiet "
        "fabric; below ~3 s a congested but live link may be dropped"
    ),
}


def _choices(options: tuple[str, ...]) -> str:
    return ", ".join(f"`{o}`" + (" (default)" if i == 0 else "") for i, o in enumerate(options))


def _tunable_meaning(key: str, meaning: str, default: int | None) -> str:
    parts = [meaning]
    if default is not None:
        parts.append(f"default {default}")
    if key in _TUNABLE_NOTES:
        parts.append(_TUNABLE_NOTES[key])
    return "; ".join(parts)


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("transport", _choices(TRANSPORTS), "fabric transport (one per volume)"),
    *(Parameter(t.key, f"{t.low}..{t.high}", _tunable_meaning(t.key, t.meaning, t.default)) for t in TUNABLES),
    Parameter(
        "auth",
        _choices(AUTH_MODES),
        "in-band host authentication (DH-HMAC-CHAP, see [security.md](security.md)); keys issued per node by the "
        "agents, no Secret",
    ),
    Parameter(
        "tls",
        _choices(TLS_MODES),
        "NVMe/TCP TLS 1.3 with a pre-shared key per host, issued by the agents (`transport: tcp` only; the agent "
        "needs a `:tls` portal, both ends `tlshd`; see [security.md](security.md#nvmetcp-tls)); combines with "
        "`auth`",
    ),
    *(
        Parameter(q.key, f"1..{q.high}, `0` or `max` (unlimited, the default)", f"per-pod limit: {q.meaning}", True)
        for q in QOS_KEYS
    ),
    Parameter(
        "replicas",
        "`1` (default), `2`",
        "copies of the volume: `2` keeps one on each of two storage nodes of one fabric and zone (DRBD protocol "
        "C, the controller as arbiter, `--replica-records`; see [architecture.md](architecture.md#seams-worth-knowing)"
        "); not with `dataset.*`, `auth` or `tls` yet",
    ),
    Parameter("dataset.uri", "a path or URI", "fill the volume with this data set (mounted read-only into Alluxio)"),
    Parameter("dataset.path", "an absolute Alluxio path", "the data set's path in Alluxio (default: from the uri)"),
    Parameter("dataset.pin", "`true` (default), `false`", "keep the data set cached while a volume references it"),
    Parameter("dataset.ttl", f"0..{MAX_TTL_SECONDS} s", "Alluxio frees the cached data set after this (0: never)"),
    Parameter("dataset.medium", ", ".join(f"`{m}`" for m in MEDIA), "the cache tier the data set is pinned to"),
)
KNOWN = frozenset(p.key for p in PARAMETERS)


def parameters_table() -> str:
    """docs/configuration.md's StorageClass table, made from :data:`PARAMETERS`."""
    rows = ["| key | values | meaning |", "|---|---|---|"]
    rows += [f"| `{p.key}` | {p.values} | {p.meaning}{' (mutable)' if p.mutable else ''} |" for p in PARAMETERS]
    return "\n".join(rows)


#: the keys whose values are a closed set (the chart's schema refuses any other value at ``helm install``)
_ENUMS: Mapping[str, tuple[str | bool, ...]] = {
    "transport": TRANSPORTS, "auth": AUTH_MODES, "tls": TLS_MODES, "dataset.medium": MEDIA, "replicas": REPLICAS,
    "dataset.pin": ("true", "false", True, False),
}  # fmt: skip
_SCALAR = ["string", "number", "boolean"]


def parameters_schema(mutable: bool = False) -> dict[str, object]:
    """The JSON schema of a StorageClass's parameters (``mutable``: a VolumeAttributesClass's), made from
    :data:`PARAMETERS`: the chart's ``values.schema.json`` holds exactly this (``tests/unit/test_params.py``), so
    a mistyped key fails at ``helm install``, not as a PVC event. The sidecars' ``csi.storage.k8s.io/`` keys
    pass."""
    properties: dict[str, object] = {}
    for parameter in (p for p in PARAMETERS if p.mutable or not mutable):
        choices = _ENUMS.get(parameter.key)
        properties[parameter.key] = {"enum": list(choices)} if choices else {"type": _SCALAR}
    schema: dict[str, object] = {
        "type": "object",
        "properties": properties,
        "patternProperties": {"^csi\\.storage\\.k8s\\.io/": {"type": _SCALAR}},
        "additionalProperties": False,
    }
    if mutable:
        schema["minProperties"] = 1
    return schema


def own_parameters(params: Mapping[str, str]) -> dict[str, str]:
    """``params`` without the keys the sidecars add (``csi.storage.k8s.io/...``)."""
    return {k: v for k, v in params.items() if not k.startswith(SIDECAR_PREFIX)}


def mutable_parameters(params: Mapping[str, str]) -> dict[str, str]:
    """A VolumeAttributesClass's parameters (CreateVolume's ``mutable_parameters``, ModifyVolume's): sidecar keys
    dropped, every other key a valid per-pod I/O limit (``InvalidArgument`` naming the first that is not)."""
    own = own_parameters(params)
    mutable_only(own)
    return own


@dataclass(frozen=True)
class VolumeParameters:
    """A volume's parameters, validated; the defaults are the driver's."""

    transport: str = "tcp"
    auth: str = "none"
    tls: str = "none"
    tunables: tuple[tuple[str, int], ...] = ()  # in TUNABLES order; absent: the driver's default
    limits: QosLimits = UNLIMITED  # per-pod I/O limits (the mutable part)
    dataset: DatasetSpec | None = None  # a dataset volume is filled before it is exported
    replicas: int = 1  # 2: one replica on each of two storage nodes (the controller makes the pair)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> VolumeParameters:
        own = own_parameters(params)
        unknown = sorted(set(own) - KNOWN)
        if unknown:
            raise InvalidArgument(
                f"unknown StorageClass parameter {unknown[0][:80]!r} (known: {', '.join(sorted(KNOWN))})"
            )
        transport = check_transport(own.get("transport", "tcp"))
        tls = check_tls(own.get("tls", "none"))
        if tls != "none" and transport != "tcp":
            raise InvalidArgument(f"parameter 'tls: {tls}' is for transport tcp only (NVMe/TCP TLS), not {transport}")
        replicas = own.get("replicas", "1")
        if replicas not in REPLICAS:
            raise InvalidArgument(f"parameter 'replicas' must be 1 or 2, not {replicas[:20]!r}")
        dataset = DatasetSpec.from_parameters(own)
        auth = check_auth(own.get("auth", "none"))
        if replicas == "2" and (dataset is not None or auth != "none" or tls != "none"):
            raise InvalidArgument(
                "parameter 'replicas: 2' does not combine with a dataset (dataset.uri), auth or tls yet: each "
                "agent of a pair would issue its own keys"
            )
        return cls(
            transport=transport,
            auth=auth,
            tls=tls,
            tunables=tunables_from(own),
            limits=limits_from(own),
            dataset=dataset,
            replicas=int(replicas),
        )

    def to_map(self) -> dict[str, str]:
        doc = {"transport": self.transport, "auth": self.auth, "tls": self.tls}
        doc.update({key: str(value) for key, value in self.tunables})
        doc.update(self.limits.to_context())
        if self.dataset is not None:
            doc.update(self.dataset.to_parameters())
        if self.replicas != 1:
            doc["replicas"] = str(self.replicas)
        return doc

    def tunable(self, key: str) -> int | None:
        """The StorageClass value of tunable ``key``; ``None``: the driver's default."""
        return dict(self.tunables).get(key)

    def immutable(self) -> VolumeParameters:
        """These parameters without the mutable ones (what a repeated CreateVolume must match)."""
        return replace(self, limits=UNLIMITED)

    def with_changes(self, changes: Mapping[str, str]) -> VolumeParameters:
        """These parameters after a VolumeAttributesClass change (validated mutable keys; ``0``/``max``: the
        limit is lifted)."""
        limits = dict(self.limits.values)
        for key in changes:
            value = limits_from({key: changes[key]}).get(key)
            if value is None:
                limits.pop(key, None)
            else:
                limits[key] = value
        ordered = tuple((k, limits[k]) for k in QOS_KEY_NAMES if k in limits)
        return replace(self, limits=QosLimits(ordered))
