"""What the controller tells a node about an NVMe-oF volume: the typed volume context, and the ONE table of
connection tunables (StorageClass key, range, nvme-cli flag, default) that StorageClass validation, the
controller and the node's connector all read. No I/O.

Contract:
- :meth:`VolumeContext.to_dict` and :meth:`VolumeContext.from_dict` are each other's inverse; the dict is the
  CSI ``volume_context`` (string keys and values). Keys that are not ours (the publish context's ``hostNqn``
  and ``readonly``, keys of a later version) are ignored.
- A missing or malformed key raises ``InvalidArgument`` naming the key: a node never connects anything from a
  context it does not fully understand.
- :func:`tunables_from` range-checks StorageClass values (``InvalidArgument`` naming the key), so a typo can
  never hang a node (e.g. an infinite ``ctrlLossTmo``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.qos import UNLIMITED, QosLimits, limits_from
from nvmeof_csi.nvmeof.tlspsk import check_tls

TRANSPORTS = ("tcp", "rdma")
#: The ANA states a portal group can be in (what an agent sets and `nvmeofctl portals ana` accepts).
ANA_STATES = ("optimized", "non-optimized", "inaccessible", "persistent-loss", "change")


@dataclass(frozen=True)
class Tunable:
    """One connection tunable: ``key`` is both the StorageClass parameter and the volume-context key.

    ``option`` is the kernel's own connect option, which the node writes to ``/dev/nvme-fabrics``; ``flag`` is
    the equivalent ``nvme connect`` option, for operators reproducing a connect by hand (empty: written to the
    controller's sysfs attribute ``sysfs`` after connecting); ``default`` is the driver's bounded default
    (``None``: the kernel's).
    """

    key: str
    low: int
    high: int
    flag: str
    default: int | None
    meaning: str
    sysfs: str = ""
    option: str = ""


#: Bounded defaults: a lost target is retried for 10 minutes (never forever: a reboot must not hang), I/O is
#: queued meanwhile (fast_io_fail off), keep-alive notices a dead link within 5 s.
TUNABLES: tuple[Tunable, ...] = (
    Tunable(
        "ctrlLossTmo", 1, 3600, "--ctrl-loss-tmo", 600, "seconds a lost controller is retried", option="ctrl_loss_tmo"
    ),
    Tunable(
        "reconnectDelay", 1, 600, "--reconnect-delay", 2, "seconds between reconnect attempts", option="reconnect_delay"
    ),
    Tunable(
        "fastIoFailTmo",
        0,
        3600,
        "",
        None,
        "seconds before queued I/O fails while reconnecting",
        sysfs="fast_io_fail_tmo",
        option="fast_io_fail_tmo",
    ),
    Tunable(
        "keepAliveTmo", 1, 600, "--keep-alive-tmo", 5, "NVMe keep-alive timeout in seconds", option="keep_alive_tmo"
    ),
    Tunable(
        "nrIoQueues",
        1,
        128,
        "--nr-io-queues",
        None,
        "I/O queues per controller (queue-depth QoS)",
        option="nr_io_queues",
    ),
    Tunable(
        "queueSize", 16, 1024, "--queue-size", None, "entries per I/O queue (queue-depth QoS)", option="queue_size"
    ),
    Tunable("tos", 0, 255, "--tos", None, "IP type of service of NVMe/TCP connections", option="tos"),
)
TUNABLE_KEYS = tuple(t.key for t in TUNABLES)


def tunables_from(values: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """The tunables present in ``values`` (StorageClass parameters or a volume context), range-checked, in
    table order. Other keys are ignored."""
    found = []
    for tunable in TUNABLES:
        if tunable.key not in values:
            continue
        text = values[tunable.key]
        try:
            value = int(text)
        except ValueError as exc:
            raise InvalidArgument(f"parameter {tunable.key!r} must be an integer, not {text!r}") from exc
        if not tunable.low <= value <= tunable.high:
            raise InvalidArgument(
                f"parameter {tunable.key!r} must be within {tunable.low}..{tunable.high}, not {value}"
            )
        found.append((tunable.key, value))
    return tuple(found)


#: In-band host authentication (DH-HMAC-CHAP): none, the host proves its key, or both sides prove theirs.
AUTH_MODES = ("none", "dhchap", "dhchap-bidirectional")


def check_auth(mode: str) -> str:
    if mode not in AUTH_MODES:
        raise InvalidArgument(f"parameter 'auth' must be one of {', '.join(AUTH_MODES)}, not {mode!r}")
    return mode


def check_transport(transport: str) -> str:
    """One transport per volume: its paths are the agent's portals of that transport (mixing TCP and RDMA paths
    in one multipath head would put both under one I/O policy and ANA group with very different latencies)."""
    if transport not in TRANSPORTS:
        raise InvalidArgument(
            f"parameter 'transport' must be one of {', '.join(TRANSPORTS)} (one transport per "
            f"volume), not {transport[:40]!r}"
        )
    return transport


@dataclass(frozen=True)
class Portal:
    """One address of a volume's subsystem: ``trtype:traddr:trsvcid``."""

    trtype: str
    traddr: str
    trsvcid: str

    @property
    def key(self) -> str:
        return f"{self.trtype}:{self.traddr}:{self.trsvcid}"


def parse_portals(text: str) -> tuple[Portal, ...]:
    """``tcp:10.0.0.5:4420,rdma:10.0.2.5:4420`` (IPv6 in brackets) -> portals."""
    portals = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        trtype, _, rest = item.partition(":")
        if rest.startswith("["):
            addr, _, port = rest[1:].partition("]:")
        else:
            addr, _, port = rest.rpartition(":")
        if trtype not in TRANSPORTS or not addr or not port.isdigit():
            raise InvalidArgument(f"volume context portal {item!r} is not TRTYPE:TRADDR:TRSVCID")
        portals.append(Portal(trtype, addr, port))
    return tuple(portals)


def _required(context: Mapping[str, str], key: str) -> str:
    value = context.get(key, "")
    if not value:
        raise InvalidArgument(f"volume context has no {key!r} (not an NVMe-oF volume of this driver)")
    return value


@dataclass(frozen=True)
class VolumeContext:
    """Everything a node needs to reach one NVMe-oF volume."""

    nqn: str
    namespace_uuid: str
    transport: str
    portals: tuple[Portal, ...]
    tunables: tuple[tuple[str, int], ...] = ()
    agent: str = ""  # the target agent that holds the volume (informational)
    auth: str = "none"  # DH-HMAC-CHAP mode (AUTH_MODES); the node's keys come from the volume's agent
    tls: str = "none"  # NVMe/TCP TLS mode (``nvmeof/tlspsk.py``); the node's PSK comes from the volume's agent
    qos: QosLimits = UNLIMITED  # per-pod I/O limits at creation (a live change reaches the node another way)

    def tunable(self, key: str) -> int | None:
        """The StorageClass value of ``key``, or ``None`` when the StorageClass left it to the default."""
        return dict(self.tunables).get(key)

    def to_dict(self) -> dict[str, str]:
        doc = {
            "nqn": self.nqn,
            "namespaceUUID": self.namespace_uuid,
            "transport": self.transport,
            "portals": ",".join(p.key for p in self.portals),
        }
        if self.agent:
            doc["agent"] = self.agent
        if self.auth != "none":
            doc["auth"] = self.auth
        if self.tls != "none":
            doc["tls"] = self.tls
        doc.update({key: str(value) for key, value in self.tunables})
        doc.update(self.qos.to_context())
        return doc

    @classmethod
    def from_dict(cls, context: Mapping[str, str]) -> VolumeContext:
        portals = parse_portals(_required(context, "portals"))
        return cls(
            nqn=_required(context, "nqn"),
            namespace_uuid=_required(context, "namespaceUUID"),
            transport=check_transport(context.get("transport", "tcp")),
            portals=portals,
            tunables=tunables_from(context),
            agent=context.get("agent", ""),
            auth=check_auth(context.get("auth", "none")),
            tls=check_tls(context.get("tls", "none")),
            qos=limits_from(context),
        )
