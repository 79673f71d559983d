"""Benchmark: failover between machines, side by side with the same on one machine, in one lab cluster boot.
Writes results/bench-across.json.

The kernel target serves a namespace on ``storage-1`` over portals A (optimized) and B (non-optimized) on its two
fabric links (``lab/across.py``). It is read and written, under a 4 KiB O_DIRECT write+verify probe, from two
places, alternately, in the same run:

- **one machine** (the baseline, what every single-VM benchmark measures): the initiator is ``storage-1`` itself,
  talking to its own addresses over ``lo``;
- **between machines**: the initiator is ``gpu-1``, over the lab's links.

Two faults, over NVMe/TCP and NVMe/RDMA (soft-RoCE): a **planned failover** (A set inaccessible and B optimized:
what an operator's ``nvmeofctl ana set`` does before maintenance) and a **path loss** (A's packets silently
dropped for the whole probe, for each keep-alive timeout: between machines the host end of gpu-1's link A is
blocked on the lab bridge; on one machine a tc filter drops ``lo`` traffic to A's port). The figure is each
fault's stall, the longest gap between two completions, and its ratio between machines / one machine. Errors
must be 0. RDMA cannot lose one path on one machine (soft-RoCE loops its own traffic back inside the device,
below any qdisc), so that pair is reported as n/a (as is anything the smoke does not run).

usage: python -m bench.across [--kato 2 5] [--rounds 2] [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.results import save
from lab.across import TARGET, path_of, portals, serve, under_probe
from lab.cluster import LabCluster
from lab.fabric import Fabric, wait_until

NQN = "nqn.2026-11.io.nvmeof:vol:5c1a2b3d-0000-4000-8000-00000000be01"
IMAGE = "/scratch/bench-across.img"
PLACES = {"one machine": TARGET, "between machines": "gpu-1"}
CLEAR_ORDER = ("gpu-1", TARGET)  # the remote initiator first: it must not reconnect to a half-removed target
Row = dict[str, Any]


def fresh(cluster: LabCluster) -> None:
    """No connection on either initiator, no target object on ``storage-1``, then the namespace (not yet on a
    port), allowed to both initiators."""
    for name in CLEAR_ORDER:
        Fabric(cluster.vm(name)).clear()
    cluster.vm(TARGET).check(["truncate", "-s", "128M", IMAGE])
    hosts = [cluster.vm(name).hostnqn for name in PLACES.values()]
    Fabric(cluster.vm(TARGET)).add_subsystem(NQN, IMAGE, hosts=hosts)


def drop_path_a(cluster: LabCluster, initiator: str, trsvcid: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(apply, undo) of losing path A silently, as it can be made from ``initiator``."""
    if initiator == TARGET:
        fabric = Fabric(cluster.vm(TARGET))
        return lambda: fabric.blackhole(trsvcid, on=True), lambda: fabric.blackhole(0, on=False)
    return lambda: cluster.black_hole(initiator, "fa"), lambda: cluster.restore(initiator, "fa")


def one_run(cluster: LabCluster, place: str, trtype: str, fault: str, kato: int, lead: float) -> Row:
    """One fault under the probe on a fresh connection from ``place``."""
    initiator = PLACES[place]
    fresh(cluster)
    target, host, vm = Fabric(cluster.vm(TARGET)), Fabric(cluster.vm(initiator)), cluster.vm(initiator)
    a, b = portals(cluster, trtype)
    head = serve(cluster, initiator, NQN, trtype, kato=kato)
    path_a = path_of(host, NQN, a)
    if fault == "planned failover":

        def flip() -> None:
            target.set_ana(a.port_id, "inaccessible")
            target.set_ana(b.port_id, "optimized")

        result, proved = under_probe(vm, head, lead + 5, flip, lambda: path_a()[1] == "inaccessible", lead=lead)
    else:
        apply, undo = drop_path_a(cluster, initiator, a.trsvcid)
        try:
            seconds = lead + 2.5 * kato + 6
            result, proved = under_probe(vm, head, seconds, apply, lambda: path_a()[0] != "live", seconds, lead=lead)
        finally:
            undo()
    row: Row = {"place": place, "transport": trtype, "fault": fault, "keep_alive_s": kato}
    row.update(stall_s=result.max_gap_s, errors=result.errors, ios=result.ios, seen_by_initiator=proved)
    row.update(resumed_ios=result.ios_after_last_stall, stalls=result.stalls[:5])
    if result.errors or not proved or not result.ios_after_last_stall:
        row["errlog"] = result.errlog[:5]
    wait_until(lambda: path_a()[0] == "live", 60)
    return row


def plan(args: argparse.Namespace) -> list[tuple[str, str, str, int]]:
    """Every (place, transport, fault, keep-alive) to run once per round, places alternating."""
    katos = [2] if args.smoke else ([2, 5] if args.quick else sorted(set(args.kato)))
    out = []
    for trtype in ("tcp", "rdma"):
        for place in PLACES:
            if not args.smoke or (trtype, place) == ("tcp", "between machines"):  # smoke: this path once
                out.append((place, trtype, "planned failover", 5))
        for kato in katos:
            for place in PLACES:
                if not (trtype == "rdma" and place == "one machine"):
                    out.append((place, trtype, "path loss", kato))
    return out


def summarise(rows: list[Row]) -> list[Row]:
    """Per (transport, fault, keep-alive): the median stall in each place and between / one machine."""
    out: list[Row] = []
    keys = dict.fromkeys((r["transport"], r["fault"], r["keep_alive_s"]) for r in rows)
    for trtype, fault, kato in keys:
        stall = {}
        for place in PLACES:
            mine = [r["stall_s"] for r in rows if (r["transport"], r["fault"], r["keep_alive_s"], r["place"]) == (
                trtype, fault, kato, place)]  # fmt: skip
            stall[place] = round(statistics.median(mine), 3) if mine else None
        one, across = stall["one machine"], stall["between machines"]
        ratio = round(across / one, 2) if one and across is not None else None
        out.append({"transport": trtype, "fault": fault, "keep_alive_s": kato, "stall_s": stall, "ratio": ratio})
    return out


def section(doc: dict[str, Any]) -> list[str]:
    """The report's table: each fault's stall on one machine and between machines."""
    lines = [
        "| transport | fault | keep-alive | one machine | between machines | between / one |",
        "|---|---|---|---|---|---|",
    ]
    for s in doc["summary"]:
        one, across = s["stall_s"]["one machine"], s["stall_s"]["between machines"]
        cells = [f"{v:.2f} s" if v is not None else "n/a" for v in (one, across)]
        ratio = f"{s['ratio']:g}" if s["ratio"] is not None else "n/a"
        lines.append(f"| {s['transport']} | {s['fault']} | {s['keep_alive_s']} s | {cells[0]} | {cells[1]} | {ratio} |")
    return lines


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kato", type=int, nargs="+", default=[2, 5], help="keep-alive timeouts for path loss (s)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each pair")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="keep-alive 2 and 5 s, one round")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="CI: keep-alive 2 s, one round, one planned failover (TCP, between machines); not a measurement",
    )
    return ap


def run(cluster: LabCluster, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark on a running lab cluster (modules loaded); leaves no target object or connection behind.
    Raises AssertionError when any run had an I/O error or a fault its initiator never saw."""
    started, rows = time.monotonic(), []
    rounds = 1 if args.quick or args.smoke else args.rounds
    lead = 2.0 if args.smoke else 3.0
    try:
        for _ in range(rounds):
            for place, trtype, fault, kato in plan(args):
                rows.append(one_run(cluster, place, trtype, fault, kato, lead))
                print(f"bench across: {trtype} {fault} ({place}, keep-alive {kato}s): stall "
                      f"{rows[-1]['stall_s']:.2f}s, {rows[-1]['errors']} errors", flush=True)  # fmt: skip
    finally:
        for name in CLEAR_ORDER:
            Fabric(cluster.vm(name)).clear()
    doc = {"quick": args.quick, "smoke": args.smoke, "runs": rows, "summary": summarise(rows)}
    doc.update(errors=sum(r["errors"] for r in rows), unseen=sum(not r["seen_by_initiator"] for r in rows))
    doc.update(kernel=cluster.vm(TARGET).ready["kernel"], wall_seconds=round(time.monotonic() - started, 1))
    save("across", doc)
    if doc["errors"] or doc["unseen"]:
        raise AssertionError(f"bench across: {doc['errors']} I/O errors, {doc['unseen']} faults never seen")
    return doc


def main() -> None:
    args = parser().parse_args()
    with LabCluster().start() as cluster:
        for vm in cluster.vms.values():
            Fabric(vm).load(rdma=True)
        run(cluster, args)


if __name__ == "__main__":
    main()
