"""A target portal as the agent is configured with it (``--portal ID:TRTYPE:TRADDR:TRSVCID[:GROUP[:tls]]``); the
ANA states a portal group can be in are ``nvmeof.context.ANA_STATES``.

A portal serves either TLS or clear text, never both: a ``tls`` portal (NVMe/TCP only) requires TLS 1.3 of every
connection (``addr_tsas`` tls1.3, ``addr_treq`` required) and exports only the volumes created with ``tls: psk``;
every other portal exports only the clear-text volumes. An agent that serves both has a portal of each kind per
path (for example ``1:tcp:10.0.0.5:4420:a``, ``3:tcp:10.0.0.5:4430:a:tls``).

Contract: :class:`PortSpec` validates on construction and :meth:`PortSpec.parse` raises ``InvalidArgument``
naming the portal text.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.nvmeof.context import TRANSPORTS


@dataclass(frozen=True)
class PortSpec:
    """One target portal: nvmet port ``port_id`` listening on ``trtype``/``traddr``/``trsvcid``, member of
    portal group ``group`` (ANA states are set per group)."""

    port_id: int
    trtype: str
    traddr: str
    trsvcid: int
    group: str = "a"
    tls: bool = False

    def __post_init__(self) -> None:
        if self.trtype not in TRANSPORTS:
            raise InvalidArgument(f"portal {self.port_id}: transport must be one of {', '.join(TRANSPORTS)}")
        if not 0 < self.port_id < 65535:
            raise InvalidArgument(f"portal id {self.port_id} must be within 1..65534")
        if not 0 < self.trsvcid < 65536:
            raise InvalidArgument(f"portal {self.port_id}: service id {self.trsvcid} must be a TCP port")
        if self.tls and self.trtype != "tcp":
            raise InvalidArgument(f"portal {self.port_id}: TLS is for NVMe/TCP portals only, not {self.trtype}")

    @property
    def adrfam(self) -> str:
        return "ipv6" if ":" in self.traddr else "ipv4"

    @classmethod
    def parse(cls, text: str) -> PortSpec:
        """``ID:TRTYPE:TRADDR:TRSVCID[:GROUP[:tls]]``, e.g. ``1:tcp:10.0.0.5:4420:a`` (IPv6 in brackets)."""
        rest = text
        addr = ""
        if "[" in text:
            before, _, after = text.partition("[")
            addr, _, tail = after.partition("]")
            rest = before + "ADDR" + tail
        parts = rest.split(":")
        if len(parts) not in (4, 5, 6) or (len(parts) == 6 and parts[5] != "tls"):
            raise InvalidArgument(f"portal {text!r} must be ID:TRTYPE:TRADDR:TRSVCID[:GROUP[:tls]]")
        try:
            group = parts[4] if len(parts) >= 5 else "a"
            return cls(int(parts[0]), parts[1], addr or parts[2], int(parts[3]), group, len(parts) == 6)
        except ValueError as exc:
            raise InvalidArgument(f"portal {text!r}: ID and TRSVCID must be numbers") from exc
