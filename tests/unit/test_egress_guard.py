"""The egress guard's rules (``host/egress_guard.py``): the argv it gives ``ip``, in an order that never
refuses the host's own packets, made only when the node's rules differ. The proof that a pod is refused and
the node is not is in the Kubernetes tier (``tests/k8s/test_tenant_pod.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from nvmeof_csi.errors import CommandError, ConfigError
from nvmeof_csi.host.egress_guard import BASE, EgressGuard, parse_guard
from nvmeof_csi.host.executor import Result


class Rules:
    """``ip rule`` over an in-memory table per family (priority -> argv of each rule)."""

    def __init__(self) -> None:
        self.table: dict[str, list[tuple[int, list[str]]]] = {"-4": [], "-6": []}
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True, stdin: str | None = None,
            secrets: Sequence[str] = ()) -> Result:  # fmt: skip
        argv = list(argv)
        self.calls.append(argv)
        if argv[:2] == ["ip", "-j"]:
            if argv[2] not in self.table:  # a family this kernel lacks
                if check:
                    raise CommandError(argv, 1, "", "RTNETLINK answers: Address family not supported by protocol")
                return Result(1, "", "RTNETLINK answers: Address family not supported by protocol")
            return Result(0, json.dumps([{"priority": p} for p, _ in self.table[argv[2]]]), "")
        family, verb, prio = argv[1], argv[3], int(argv[argv.index("priority") + 1])
        rules = self.table[family]
        if verb == "del":
            rules.remove(next(r for r in rules if r[0] == prio))
        else:
            rules.append((prio, argv[4:]))
            rules.sort(key=lambda r: r[0])
        return Result(0, "", "")


def test_entries_are_parsed_and_bad_ones_refused_by_name() -> None:
    guarded = parse_guard("169.254.11.0/24:4420-4421 10.99.10.1/32:4420 [fd00::/64]:4420 192.0.2.0/24")
    assert [(str(g.network), g.ports) for g in guarded] == [
        ("169.254.11.0/24", (4420, 4421)), ("10.99.10.1/32", (4420, 4420)), ("fd00::/64", (4420, 4420)),
        ("192.0.2.0/24", None),
    ]  # fmt: skip
    for bad, why in (
        ("10.0.0.1/24", "host bits set"),
        ("10.0.0.0/24:0", "ports must be 1-65535"),
        ("10.0.0.0/24:4421-4420", "low to high"),
        ("10.0.0.0/24:http", "invalid literal"),
        ("nowhere", "does not appear to be an IPv4 or IPv6 network"),
        (" ".join(f"10.0.{i}.0/24" for i in range(17)), "at most 16 entries"),
    ):
        with pytest.raises(ConfigError, match=why):
            parse_guard(bad)


def test_the_host_skips_the_prohibit_rule_and_its_goto_target_exists_before_the_goto() -> None:
    rules = Rules()
    guard = EgressGuard(parse_guard("169.254.11.0/24:4420-4421 fd00::/64"), rules)
    assert guard.apply() is True
    sel = ["to", "169.254.11.0/24", "ipproto", "6", "dport", "4420-4421"]  # by number: no /etc/protocols needed
    assert rules.table["-4"] == [
        (BASE, ["priority", str(BASE), "iif", "lo", *sel, "goto", str(BASE + 2)]),
        (BASE + 1, ["priority", str(BASE + 1), *sel, "prohibit"]),
        (BASE + 2, ["priority", str(BASE + 2), *sel, "nop"]),
    ]
    adds = [c for c in rules.calls if c[1] == "-4" and c[3] == "add"]
    assert [c[-1] for c in adds] == ["nop", str(BASE + 2), "prohibit"]  # target, goto, then the refusal
    assert [r[1][-1] for r in rules.table["-6"]] == [str(BASE + 5), "prohibit", "nop"]  # its own band


def test_a_second_apply_changes_nothing_and_a_removed_rule_comes_back() -> None:
    rules = Rules()
    guard = EgressGuard(parse_guard("169.254.11.0/24:4420"), rules)
    guard.apply()
    made = list(rules.table["-4"])
    calls = len(rules.calls)
    assert guard.apply() is False and len(rules.calls) == calls + 2  # two reads, nothing written
    rules.table["-4"].pop(0)  # someone removed the host's rule
    rules.table["-4"].append((7, ["unrelated"]))  # a rule of someone else, outside the band: left alone
    assert guard.apply() is True
    assert [r for r in rules.table["-4"] if r[0] != 7] == made and (7, ["unrelated"]) in rules.table["-4"]
    deletes = [c for c in rules.calls[calls:] if c[3] == "del"]
    assert deletes[0][-1] == str(BASE + 1)  # the refusal goes first: the host is never refused meanwhile


def test_a_kernel_without_ipv6_still_gets_its_ipv4_rules() -> None:
    rules = Rules()
    del rules.table["-6"]
    assert EgressGuard(parse_guard("169.254.11.0/24:4420"), rules).apply() is True
    assert len(rules.table["-4"]) == 3
    with pytest.raises(CommandError):  # an IPv6 entry on such a kernel is an error, not a silent gap
        EgressGuard(parse_guard("fd00::/64"), rules).apply()
