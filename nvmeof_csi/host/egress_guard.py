"""A GPU node's egress guard: the pods on the node cannot open connections to the storage portals, while the
node itself (its kernel's NVMe/TCP controllers, the node plugin) reaches them as before.

Policy routing (iproute2's ``ip rule``; no firewall tool is needed) decides by where a packet comes from: a
packet the host itself sends is looked up with input interface ``lo``, a pod's is forwarded from the pod's
interface. For each guarded destination (a CIDR, with or without TCP ports) three rules, at priorities from
:data:`BASE` (before the main table and before most CNIs' rules)::

    P     iif lo to CIDR [ipproto tcp dport PORTS] goto P+2   # the host's own packets skip the next rule
    P+1   to CIDR [ipproto tcp dport PORTS] prohibit           # anything else (a pod's) is refused
    P+2   to CIDR [ipproto tcp dport PORTS] nop                # the host's go on through the rules as ever

A pod's connect then fails at once ("administratively prohibited"). Guard only destinations that are not
this node's own addresses (a node serving a portal would refuse its remote hosts too): the chart runs the
guard on GPU nodes. A hostNetwork pod is the node itself (Pod Security's baseline level forbids it).

Contract: :func:`parse_guard` refuses a malformed entry with ``ConfigError`` naming it. :meth:`EgressGuard.apply`
makes the node's rules in the band [BASE, BASE + 3 * MAX_ENTRIES) exactly the wanted ones: when the
priorities present there (per address family) differ from the wanted ones, it removes them and adds the
wanted rules; else it changes nothing (idempotent). :meth:`EgressGuard.run` applies every ``every`` seconds
(a rule that was removed comes back), logging a failure and trying again.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from dataclasses import dataclass

from nvmeof_csi.errors import CommandError, ConfigError
from nvmeof_csi.host.executor import Executor

log = logging.getLogger(__name__)

BASE = 90
MAX_ENTRIES = 16


@dataclass(frozen=True)
class Guarded:
    """One guarded destination: a network, and a TCP port range (``None``: every protocol and port)."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    ports: tuple[int, int] | None = None

    @property
    def family(self) -> str:
        return "-4" if self.network.version == 4 else "-6"

    def selector(self) -> list[str]:
        # the protocol by number: a minimal image has no /etc/protocols to look "tcp" up in
        ports = ["ipproto", "6", "dport", f"{self.ports[0]}-{self.ports[1]}"] if self.ports else []
        return ["to", str(self.network), *ports]


def parse_guard(text: str) -> tuple[Guarded, ...]:
    """Space-separated ``CIDR`` or ``CIDR:PORT`` or ``CIDR:LOW-HIGH`` (IPv6: ``[CIDR]:PORT``)."""
    found = []
    for entry in text.split():
        where = f"--egress-guard entry {entry[:80]!r}"
        network, ports = entry, ""
        if entry.startswith("["):
            network, _, rest = entry[1:].partition("]")
            ports = rest.removeprefix(":") if rest.startswith(":") else ("!" if rest else "")
        elif entry.count(":") == 1:
            network, ports = entry.split(":")
        try:
            net = ipaddress.ip_network(network, strict=True)
            low, _, high = ports.partition("-")
            span = (int(low), int(high or low)) if ports else None
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc} (CIDR, CIDR:PORT or CIDR:LOW-HIGH)") from exc
        if span is not None and not 1 <= span[0] <= span[1] <= 65535:
            raise ConfigError(f"{where}: ports must be 1-65535, low to high")
        found.append(Guarded(net, span))
    if len(found) > MAX_ENTRIES:
        raise ConfigError(f"--egress-guard: at most {MAX_ENTRIES} entries (give wider networks)")
    return tuple(found)


class EgressGuard:
    def __init__(self, guarded: tuple[Guarded, ...], executor: Executor) -> None:
        self._guarded, self._exec = guarded, executor

    def _rules(self) -> dict[str, list[list[str]]]:
        """family -> the wanted rules' argument lists, in order."""
        wanted: dict[str, list[list[str]]] = {"-4": [], "-6": []}
        for index, entry in enumerate(self._guarded):
            prio = BASE + 3 * index
            sel = entry.selector()
            wanted[entry.family] += [  # in this order: a goto before its target is skipped, so the host's
                ["priority", str(prio + 2), *sel, "nop"],  # packets would meet the prohibit rule meanwhile
                ["priority", str(prio), "iif", "lo", *sel, "goto", str(prio + 2)],
                ["priority", str(prio + 1), *sel, "prohibit"],
            ]
        return wanted

    def _present(self, family: str, needed: bool) -> list[int]:
        """Our band's priorities in ``family``'s rules. A family the kernel lacks (IPv6 turned off) has none,
        unless rules are ``needed`` there: then its error is raised."""
        shown = self._exec.run(["ip", "-j", family, "rule", "show"], timeout=10, check=needed)
        if shown.rc != 0:
            return []
        priorities = [int(rule.get("priority", -1)) for rule in json.loads(shown.out or "[]")]
        return sorted(p for p in priorities if BASE <= p < BASE + 3 * MAX_ENTRIES)

    def apply(self) -> bool:
        """Make the rules the wanted ones; whether anything changed."""
        changed = False
        for family, rules in self._rules().items():
            present = self._present(family, needed=bool(rules))
            if present == sorted(int(rule[1]) for rule in rules):
                continue
            for prio in sorted(present, key=lambda p: (p - BASE) % 3 != 1):  # the prohibit rules go first
                self._exec.run(["ip", family, "rule", "del", "priority", str(prio)], timeout=10)
            for rule in rules:
                self._exec.run(["ip", family, "rule", "add", *rule], timeout=10)
            changed = True
        if changed:
            log.info("egress guard: pods on this node cannot connect to %s", ", ".join(map(_shown, self._guarded)))
        return changed

    def run(self, stop: threading.Event, every: float = 60.0) -> None:
        """Apply now and then every ``every`` seconds until ``stop`` is set (a background loop)."""
        while True:
            try:
                self.apply()
            except (CommandError, ValueError) as exc:
                log.error("egress guard: the rules could not be made (pods may reach the portals): %s", exc)  # noqa: TRY400 (the cause is named)
            if stop.wait(every):
                return


def _shown(entry: Guarded) -> str:
    return f"{entry.network}" + (f" tcp {entry.ports[0]}-{entry.ports[1]}" if entry.ports else "")
