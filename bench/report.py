"""The benchmark report a person reads: every figure of the performance goals, its measured value from
``results/bench-*.json``, its goal and whether it holds, as ``results/bench-report.md`` with a PNG of each
figure's distance from its goal (``results/bench-goals.png``) and the curves behind the figures
(``results/bench-curves.png``: the I/O timeline through each black-holed path with the stall marked, stall
against keep-alive, stage latency against other controllers, provisioning throughput against clients, RSS
over cycles, data path against raw, QoS achieved against limit).

Contract: reads only what the benchmarks wrote; a figure whose benchmark did not run (or does not exist yet)
is listed as "not measured", never guessed. Exit status 0 whatever the figures say (goals are reported, not
enforced: a benchmark fails its own run only on I/O errors). Usage: ``python -m bench.report [results]``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench import across
from bench.curves import curves
from bench.scale_notes import scale_notes
from lab.build import REPO

Doc = Mapping[str, Any]


def worst(value: Any) -> float:
    """A figure reported once or per run (a list): its largest value."""
    return max(float(v) for v in value) if isinstance(value, list) else float(value)


@dataclass(frozen=True)
class Figure:
    name: str
    bench: str  # results/bench-<bench>.json
    value: Callable[[Doc], float]
    goal: float
    higher_is_better: bool
    unit: str = "x"

    def holds(self, v: float) -> bool:
        return v >= self.goal if self.higher_is_better else v <= self.goal

    def margin(self, v: float) -> float:
        """value/goal oriented so that ≥ 1 means the goal holds."""
        if self.higher_is_better:
            return v / self.goal if self.goal else float("inf")
        return self.goal / v if v else float("inf")


def most(mapping: Mapping[str, Any], skip: str = "0") -> float:
    """The largest value of a per-level mapping, the baseline level ``skip`` left out."""
    return max(float(v) for k, v in mapping.items() if k != skip)


# fmt: off
FIGURES = (
    Figure("provision create+delete, agent vs raw script with the same durability", "provision",
           lambda d: float(d["ratio_vs_durable"]), 1.25, False),
    Figure("provision create+delete, agent vs bare configfs script (image fsync only)", "provision",
           lambda d: float(d["ratio_total"]), 1.25, False),
    Figure("provisioning throughput, 16 clients vs 1, as a share of the machine's own ceiling", "provision",
           lambda d: float(d["speedup_vs_script_ceiling"]), 0.9, True, ""),
    Figure("agent RSS growth over create/delete cycles after warm-up", "provision",
           lambda d: float(d["rss_growth_pct"]), 5.0, False, "%"),
    Figure("agent open files growth over create/delete cycles after warm-up", "provision",
           lambda d: float(d["fd_growth"]), 0.0, False, ""),
    Figure("NodeStage+NodePublish vs bare connect/mkfs/mount", "stage", lambda d: float(d["ratio_median"]), 1.15,
           False),
    Figure("NodeUnpublish+NodeUnstage vs bare umount/disconnect", "stage",
           lambda d: float(d["down_ratio_median"]), 1.25, False),
    Figure("ControllerUnpublish+DeleteVolume vs raw script with the same durability", "stage",
           lambda d: float(d["ctl_ratio_median"]), 1.25, False),
    Figure("data path through the driver vs raw namespace, worst fio job (mount, block)", "node",
           lambda d: float(d["datapath"]["worst_ratio"]), 0.98, True),
    Figure("data path: published mount vs ext4 made and mounted by hand, worst fio job (the driver's own share)",
           "node", lambda d: float(d["datapath"]["worst_mount_vs_ext4"]), 0.98, True),
    Figure("stage latency with 64/128 other controllers vs none, worst", "node",
           lambda d: most(d["scaling"]["ratio"]), 1.5, False),
    Figure("node plugin RSS growth over stage/unstage cycles after warm-up", "node",
           lambda d: float(d["resources"]["rss_growth_pct"]), 5.0, False, "%"),
    Figure("node plugin open files growth over stage/unstage cycles after warm-up", "node",
           lambda d: float(d["resources"]["fd_growth"]), 0.0, False, ""),
    Figure("black-holed path: I/O stall at the default keep-alive (5 s)", "pathloss",
           lambda d: float(d["default_stall_s"]), 6.0, False, "s"),
    Figure("black-holed path: worst stall / the kernel's floor (1.5 x keep-alive + 1 s)", "pathloss",
           lambda d: round(max(float(r["stall_s"]) / (1.5 * float(r["keep_alive_s"]) + 1) for r in d["runs"]), 2),
           1.0, False),
    Figure("black-holed path: I/O errors", "pathloss", lambda d: float(d["errors"]), 0.0, False, ""),
    Figure("black-holed path: stall with NVMe/TCP TLS / clear text, same keep-alive (software AES under TCG)",
           "pathloss", lambda d: round(float(d["tls_stall_s"]) / float(d["clear_stall_s_same_keep_alive"]), 2),
           1.5, False),
    Figure("path loss between machines / on one machine, TCP, same keep-alive, worst", "across",
           lambda d: max(float(s["ratio"]) for s in d["summary"] if s["fault"] == "path loss" and s["ratio"]),
           1.25, False),
    Figure("failover between machines (planned and path loss, TCP and RDMA): I/O errors", "across",
           lambda d: float(d["errors"]), 0.0, False, ""),
    Figure("dataset hydration, cold / warm", "dataset", lambda d: float(d["ratio_cold_over_warm"]), 3.0, True),
    Figure("dataset warm hydration from cache (lowest round)", "dataset",
           lambda d: 100 * min(float(x) for x in d["hit_ratio_warm"]), 90.0, True, "%"),
    Figure("QoS achieved IOPS vs limit, worst error", "qos", lambda d: worst(d["worst_error_pct"]), 5.0, False, "%"),
    Figure("QoS ModifyVolume reply to io.max in force", "qos", lambda d: worst(d["modify_to_in_force_s"]), 2.0,
           False, "s"),
    Figure("QoS I/O errors", "qos", lambda d: float(d["io_errors"]), 0.0, False, ""),
    Figure("agent CreateVolume p50 with the most volumes held / with none", "scale-agent",
           lambda d: float(d["create_p50_ratio"]), 1.2, False),
    Figure("agent DeleteVolume p50 with the most volumes held / with none", "scale-agent",
           lambda d: float(d["delete_p50_ratio"]), 1.2, False),
    Figure("agent ListVolumes page with the most volumes held / the smallest listing, worst page", "scale-agent",
           lambda d: float(d["list_page_ratio"]), 1.2, False),
    Figure("agent CreateVolume p50 on real configfs above its own system calls, most volumes / none",
           "scale-agent-lab", lambda d: float(d["own_create_p50_ratio"]), 1.2, False),
    Figure("controller CreateVolume p50 with the most agents / one agent", "scale-controller",
           lambda d: float(d["create_p50_ratio"]), 1.2, False),
    Figure("controller CreateVolume p50, most agents / one, over the same for its bare agent calls", "scale-controller",
           lambda d: float(d["create_p50_ratio_over_direct"]), 1.2, False),
    Figure("node reconcile pass per volume, most volumes published / fewest", "scale-node",
           lambda d: float(d["pass_per_volume_ratio"]), 1.2, False),
    Figure("node NodeGetVolumeStats, most volumes published / fewest", "scale-node",
           lambda d: float(d["stats_ratio"]), 1.2, False),
    Figure("node NodeStage+NodePublish, most volumes published / fewest", "scale-node",
           lambda d: float(d["stage_ratio"]), 1.2, False),
    Figure("node NodeUnpublish+NodeUnstage, most volumes published / fewest", "scale-node",
           lambda d: float(d["unstage_ratio"]), 1.2, False),
    Figure("node NodeStage+NodePublish, the node's own code (no program, mount-table read or loop stand-in scan)",
           "scale-node", lambda d: float(d["own_stage_ratio"]), 1.2, False),
    Figure("node NodeUnpublish+NodeUnstage, the node's own code (no program, mount-table read or loop stand-in scan)",
           "scale-node", lambda d: float(d["own_unstage_ratio"]), 1.2, False),
    Figure("controller CreateVolume p50 with one agent dead / all alive", "scale-controller",
           lambda d: float(d["one_dead_create_p50_ratio"]), 1.2, False),
)
# fmt: on

NOT_YET: tuple[str, ...] = ()


def load(results: Path) -> dict[str, Doc]:
    docs: dict[str, Doc] = {}
    for path in sorted(results.glob("bench-*.json")):
        try:
            docs[path.stem.removeprefix("bench-")] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return docs


def measure(docs: Mapping[str, Doc]) -> list[tuple[Figure, float | None]]:
    out: list[tuple[Figure, float | None]] = []
    for fig in FIGURES:
        doc = docs.get(fig.bench)
        try:
            out.append((fig, fig.value(doc) if doc is not None else None))
        except (KeyError, TypeError, ValueError):
            out.append((fig, None))
    return out


def plot(rows: list[tuple[Figure, float | None]], png: Path) -> None:
    measured = [(f, v) for f, v in rows if v is not None and f.goal]
    fig, ax = plt.subplots(figsize=(12, 0.75 * max(len(measured), 1) + 1.6))
    names = [textwrap.fill(f.name, 64) for f, _ in measured]
    margins = [min(f.margin(v), 5.0) for f, v in measured]
    colours = ["tab:green" if f.holds(v) else "tab:red" for f, v in measured]
    ax.barh(names, margins, color=colours)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("goal / measured (oriented: right of the dashed line = goal holds; capped at 5)")
    ax.invert_yaxis()
    ax.set_title("nvmeof-csi benchmarks against their goals")
    fig.tight_layout()
    fig.savefig(png, dpi=100, bbox_inches="tight")  # long figure names must not push the title or label out
    plt.close(fig)


def notes(docs: Mapping[str, Doc]) -> list[str]:
    """The facts behind some figures, from the same runs (each only when its run recorded it)."""
    out = []
    prov, node, loss = docs.get("provision", {}), docs.get("node", {}), docs.get("pathloss", {})
    with contextlib.suppress(KeyError):
        out.append(
            f"- provisioning: agent {prov['agent_ms_per_create']} / {prov['agent_ms_per_delete']} ms per "
            f"create / delete; the script with the agent's durability {prov['durable_ms_per_create']} / "
            f"{prov['durable_ms_per_delete']} ms; the bare script {prov['raw_ms_per_create']} / "
            f"{prov['raw_ms_per_delete']} ms."
        )
        out.append(
            f"- throughput: the agent used {prov['agent_cpu_ms_per_cycle_1']} ms of CPU per create+delete "
            f"cycle taking {prov['wall_ms_per_cycle_1']} ms with one client, on {prov['guest_cpus']} vCPUs: "
            "when CPU per cycle is near its wall time the agent is CPU-bound and more clients cannot help "
            "beyond the cores it can use."
        )
    with contextlib.suppress(KeyError):
        out.append(
            f"- the machine's own ceiling: the durable script run by {prov['concurrency']} processes at once "
            f"(no GIL, no lock) does {prov['script_concurrency_speedup']}x the cycles of one process; the "
            f"agent with {prov['concurrency']} clients {prov['concurrency_speedup']}x "
            f"({prov['speedup_vs_script_ceiling']} of the ceiling; medians of {prov.get('throughput_repeats', 1)} "
            f"alternated rounds, each round's share {prov.get('ceiling_share_runs', [])})."
        )
        out.append(
            f"- the RPC floor: an empty Health round trip through the agent takes {prov['rpc_floor_ms']} ms "
            f"({prov['rpc_floor_agent_cpu_ms']} ms of agent CPU); to a gRPC server that does nothing "
            f"{prov['bare_grpc_ms']} ms ({prov['bare_grpc_server_cpu_ms']} ms CPU). The durable script plus "
            f"one such round trip per create and per delete is already {prov['ratio_floor_any_grpc_agent']}x "
            "the script: no agent served over gRPC in Python gets below that here."
        )
    with contextlib.suppress(KeyError):
        out.append(
            f"- the agent's contract as a script (every system call the agent makes, in its order: the "
            f"status renames, all identity attributes; bench/provision_scripts.py): "
            f"{prov['contract_ms_per_create']} / {prov['contract_ms_per_delete']} ms, "
            f"{prov['ratio_contract_vs_durable']}x the durable script; with a bare round trip per call "
            f"{prov['ratio_floor_contract_grpc']}x. The agent is {prov['ratio_agent_vs_contract_grpc']}x that "
            "floor: what is left is per call in Python (gRPC's threads and messages, log lines, "
            "validation, state objects; see the profile below)."
        )
    with contextlib.suppress(KeyError):
        where = prov["profile"]
        parts = sorted(where["share"].items(), key=lambda kv: -float(kv[1]))
        out.append(
            f"- what the agent is busy with (py-spy, {where['samples']} samples over {where['cycles']} "
            f"create+delete cycles of {where['wall_ms_per_cycle']} ms, {where['agent_cpu_ms_per_cycle']} ms "
            "of agent CPU each; a sample is a thread on the CPU or in a system call such as fsync): "
            + ", ".join(f"{name} {100 * float(share):.0f}%" for name, share in parts if float(share) > 0)
            + f"; pathlib objects in {100 * float(where['pathlib_share']):.0f}% of the samples."
        )
    out += scale_notes(docs)
    with contextlib.suppress(KeyError):
        out.append(
            f"- black-holed path: stall = {loss['fit_slope']} x keepAliveTmo + {loss['fit_offset_s']} s "
            f"over {len(loss['runs'])} runs, 0 errors required (measured {loss['errors']})."
        )
    with contextlib.suppress(KeyError):
        iops = node["datapath"]["iops"]
        out.append(
            "- data path IOPS (median): "
            + "; ".join(
                f"{job}: raw {iops['raw'][job]:g}, block {iops['block'][job]:g}, mount {iops['mount'][job]:g}"
                + (f", hand-made ext4 {iops['ext4'][job]:g}" if "ext4" in iops else "")
                for job in iops["raw"]
            )
        )
        if "mount_vs_ext4" in node["datapath"]:
            out.append(
                f"- the filesystem's own cost: ext4 made and mounted by hand on a raw namespace (no driver) "
                f"vs that namespace: {node['datapath']['ratio']['ext4']}; the published mount vs that "
                f"hand-made ext4: {node['datapath']['mount_vs_ext4']}. What the mount loses against raw "
                "is ext4's, not the driver's, when the second set is within the noise of 1."
            )
        if "aa_spread" in node["datapath"]:
            out.append(
                f"- data path noise: the raw namespace measured twice in the same run differs by up to "
                f"{100 * node['datapath']['aa_spread']:.1f}% ({node['datapath']['aa_ratio']}): ratios within "
                "that of 1 are the lab's noise, not the driver's cost."
            )
        rounds = f"; every round (ms): {node['scaling']['stage_ms']}" if "stage_ms" in node["scaling"] else ""
        out.append(
            f"- stage with other controllers (median ms): {node['scaling']['stage_median_ms']}{rounds}; "
            f"connecting them took {node['scaling']['connect_seconds']} s."
        )
    return out


def render(rows: list[tuple[Figure, float | None]], docs: Mapping[str, Doc]) -> str:
    smoke = sorted(name for name, doc in docs.items() if doc.get("smoke"))
    lines = ["# Benchmark report" + (" — smoke: not a measurement" if smoke else ""), ""]
    if smoke:
        lines += [
            f"**Smoke run** ({', '.join(smoke)}): every benchmark's code path ran once at its smallest sizes"
            " (CI's bench tier). The figures below prove only that the benchmarks work; the goals are judged"
            " on `./dev bench`.",
            "",
        ]
    lines += [
        "Ratios against a baseline run side by side in the same run (TCG lab: absolute times mean little).",
        "",
        "![figures against goals](bench-goals.png)",
        "",
        "| figure | measured | goal | holds |",
        "|---|---|---|---|",
    ]
    for fig, v in rows:
        sign = "≥" if fig.higher_is_better else "≤"
        shown = "not measured" if v is None else f"{v:g}{fig.unit}"
        verdict = "" if v is None else ("yes" if fig.holds(v) else "**no**")
        lines.append(f"| {fig.name} | {shown} | {sign} {fig.goal:g}{fig.unit} | {verdict} |")
    if NOT_YET:
        lines += ["", "Not measured by any benchmark yet:", ""] + [f"- {n}" for n in NOT_YET]
    facts = notes(docs)
    if facts:
        lines += ["", "## Behind the figures", "", *facts]
    if "across" in docs:
        lines += ["", "## Failover between machines and on one machine (median stall, `bench/across.py`)", ""]
        lines += across.section(dict(docs["across"]))
    lines += ["", "![the curves behind the figures](bench-curves.png)"]
    lines += ["", "Runs: " + ", ".join(f"`bench-{k}.json`" for k in sorted(docs)) if docs else "", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results = Path(args[0]) if args else REPO / "results"
    docs = load(results)
    rows = measure(docs)
    plot(rows, results / "bench-goals.png")
    curves(docs, results / "bench-curves.png")
    (results / "bench-report.md").write_text(render(rows, docs))
    held = sum(1 for f, v in rows if v is not None and f.holds(v))
    got = sum(1 for _, v in rows if v is not None)
    smoke = " (smoke run: not a measurement)" if any(d.get("smoke") for d in docs.values()) else ""
    print(
        f"bench report{smoke}: {held} of {got} measured figures meet their goal ({len(rows) - got} not measured, "
        f"{len(NOT_YET)} figures without a benchmark yet); {results / 'bench-report.md'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
