"""``agent.drbd_status``: the kernel's ``/proc/drbd`` (DRBD 8.4) read into states, and the health they give."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nvmeof_csi.agent.drbd_status import DrbdState, parse_proc_drbd, replica_health

PROC = """version: 8.4.11 (api:1/proto:86-101)
srcversion: 211FB288A383ED945B83420
 0: cs:Connected ro:Primary/Secondary ds:UpToDate/UpToDate C r-----
    ns:4096 nr:0 dw:4096 dr:2100 al:3 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:0
 1: cs:SyncSource ro:Primary/Secondary ds:UpToDate/Inconsistent C r-----
    ns:1024 nr:0 dw:2048 dr:4096 al:3 bm:1 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:3072
\t[====>...............] sync'ed: 25.0% (3072/4096)K
\tfinish: 0:00:03 speed: 1,024 (1,024) K/sec
 2: cs:Unconfigured
 3: cs:WFConnection ro:Primary/Unknown ds:UpToDate/Outdated C r-----
    ns:0 nr:0 dw:512 dr:0 al:1 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:512
 4: cs:StandAlone ro:Secondary/Unknown ds:Outdated/DUnknown   r-----
    ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:0
"""


def test_every_configured_minor_is_read_with_its_roles_disks_and_counters() -> None:
    states = parse_proc_drbd(PROC)
    assert sorted(states) == [0, 1, 3, 4]  # the unconfigured minor is left out
    assert states[0] == DrbdState(0, "Connected", "Primary", "Secondary", "UpToDate", "UpToDate", 4096, 0, 0)
    assert states[0].in_sync and not states[0].syncing
    assert states[1].syncing and states[1].synced_percent == 25.0 and states[1].out_of_sync_kib == 3072
    assert (states[3].peer_role, states[3].peer_disk, states[3].out_of_sync_kib) == ("Unknown", "Outdated", 512)
    assert (states[4].role, states[4].disk, states[4].connection) == ("Secondary", "Outdated", "StandAlone")


def test_the_health_line_says_what_an_operator_needs() -> None:
    states = parse_proc_drbd(PROC)
    assert replica_health(states[0]) is None
    assert replica_health(states[1]) == "1 of 2 replicas in sync: resyncing 25%, 3072 KiB to copy"
    assert replica_health(states[3]) == "1 of 2 replicas in sync: the peer is Outdated (connection WFConnection)"
    assert replica_health(states[4]) == "this replica is Outdated (connection StandAlone): it must not serve"
    assert replica_health(None) == "0 of 2 replicas known: the replicated device is not configured on this node"


@given(st.text(max_size=2000))
def test_any_text_parses_without_raising(text: str) -> None:
    for minor, state in parse_proc_drbd(text).items():
        assert minor == state.minor and state.connection != "Unconfigured"


@given(st.lists(st.sampled_from(PROC.splitlines()), max_size=40))
def test_shuffled_real_lines_parse_without_raising(lines: list[str]) -> None:
    parse_proc_drbd("\n".join(lines))
