"""What the kernel's DRBD 8.4 says of its replicated devices (``/proc/drbd``), read into typed states, and what a
replicated volume's health says from them.

The 8.4 format, one block per configured minor::

     0: cs:SyncSource ro:Primary/Secondary ds:UpToDate/Inconsistent C r-----
        ns:1024 nr:0 dw:2048 dr:4096 al:3 bm:1 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:3072
            [====>...............] sync'ed: 25.0% (3072/4096)K
            finish: 0:00:03 speed: 1,024 (1,024) K/sec

Contract: :func:`parse_proc_drbd` never raises: a block it cannot read is left out, an unconfigured minor
(``cs:Unconfigured``) too, and numbers it cannot read are ``None``. The text is the kernel's, but is treated
as untrusted (bounded lengths, only known words kept). :func:`replica_health` turns one device's state into
the volume health line the controller reports (``None`` when both replicas are in sync).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MINOR = re.compile(r"^\s{0,4}(\d{1,7}): cs:([A-Za-z]{1,32})(.*)$")
_PAIR = re.compile(r"\b(ro|ds):([A-Za-z]{1,32})/([A-Za-z]{1,32})")
_COUNTER = re.compile(r"\b(ns|nr|dw|dr|oos):(\d{1,20})\b")
_SYNCED = re.compile(r"sync'ed:\s{0,4}(\d{1,3}(?:\.\d{1,3})?)%")
MAX_TEXT = 1 << 20  # /proc/drbd of a few thousand minors is far less


@dataclass(frozen=True)
class DrbdState:
    """One DRBD minor: connection state, roles and disk states (this node's, then its peer's), KiB counters
    (``oos``: out of sync, what a resync still has to copy), and the resync progress in percent."""

    minor: int
    connection: str
    role: str = "Unknown"
    peer_role: str = "Unknown"
    disk: str = "DUnknown"
    peer_disk: str = "DUnknown"
    sent_kib: int | None = None
    received_kib: int | None = None
    out_of_sync_kib: int | None = None
    synced_percent: float | None = None

    @property
    def syncing(self) -> bool:
        return self.connection.startswith(("SyncSource", "SyncTarget", "PausedSync")) or self.connection in (
            "StartingSyncS",
            "StartingSyncT",
            "WFBitMapS",
            "WFBitMapT",
            "WFSyncUUID",
        )

    @property
    def in_sync(self) -> bool:
        """Both disks UpToDate over a live connection: either side could serve every acknowledged write."""
        return self.connection == "Connected" and self.disk == "UpToDate" and self.peer_disk == "UpToDate"


def parse_proc_drbd(text: str) -> dict[int, DrbdState]:
    """Every configured minor of ``text`` (the contents of ``/proc/drbd``), by minor number."""
    states: dict[int, DrbdState] = {}
    current: dict[str, object] | None = None

    def close() -> None:
        if current is not None and current["connection"] != "Unconfigured":
            states[int(str(current["minor"]))] = DrbdState(**current)  # type: ignore[arg-type]

    for line in text[:MAX_TEXT].splitlines():
        head = _MINOR.match(line)
        if head:
            close()
            current = {"minor": int(head.group(1)), "connection": head.group(2)}
            for kind, mine, peer in _PAIR.findall(head.group(3)):
                keys = ("role", "peer_role") if kind == "ro" else ("disk", "peer_disk")
                current.update(zip(keys, (mine, peer), strict=True))
            continue
        if current is None:
            continue
        names = {"ns": "sent_kib", "nr": "received_kib", "oos": "out_of_sync_kib"}
        for key, value in _COUNTER.findall(line):
            if key in names:
                current[names[key]] = int(value)
        synced = _SYNCED.search(line)
        if synced:
            current["synced_percent"] = min(100.0, float(synced.group(1)))
    close()
    return states


def replica_health(state: DrbdState | None, replicas: int = 2) -> str | None:
    """The health line of a replicated volume from its device on the primary: ``None`` when every replica is
    in sync, else what an operator needs (``1 of 2 replicas in sync``, ``resyncing 43%``, the peer's state)."""
    if state is None:
        return f"0 of {replicas} replicas known: the replicated device is not configured on this node"
    if state.in_sync:
        return None
    if state.syncing:
        done = f"{state.synced_percent:.0f}%" if state.synced_percent is not None else "started"
        left = f", {state.out_of_sync_kib} KiB to copy" if state.out_of_sync_kib is not None else ""
        return f"1 of {replicas} replicas in sync: resyncing {done}{left}"
    if state.disk != "UpToDate":
        return f"this replica is {state.disk} (connection {state.connection}): it must not serve"
    return f"1 of {replicas} replicas in sync: the peer is {state.peer_disk} (connection {state.connection})"
