"""The curves behind the benchmark figures, drawn into one PNG (``results/bench-curves.png``).

Contract: each panel draws from one ``results/bench-*.json`` document; a panel whose document is missing or
lacks the fields says "not measured" instead of drawing anything. Never raises on a malformed document.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

Doc = Mapping[str, Any]


def timeline(ax: Axes, doc: Doc) -> None:
    """I/O completions per bucket through each black-holed path, the fault and the longest stall marked."""
    for run in doc["runs"]:
        step = float(run["timeline_ms"]) / 1000
        xs = [i * step for i in range(len(run["timeline"]))]
        rate = [n / step for n in run["timeline"]]
        line = ax.plot(xs, rate, linewidth=1, label=f"keep-alive {run['keep_alive_s']} s: stall {run['stall_s']:.1f} s")
        start, gap = max(run["stalls"], key=lambda s: s[1])
        ax.axvspan(start, start + gap, color=line[0].get_color(), alpha=0.15)
    ax.set(title="I/O through a black-holed path (longest stall shaded)", xlabel="seconds", ylabel="IOPS")
    ax.legend(fontsize=7)


def stall_fit(ax: Axes, doc: Doc) -> None:
    xs = [float(r["keep_alive_s"]) for r in doc["runs"]]
    ax.scatter(xs, [float(r["stall_s"]) for r in doc["runs"]], label="measured stall")
    top = max(xs) + 1
    slope, offset = float(doc["fit_slope"]), float(doc["fit_offset_s"])
    ax.plot([0, top], [offset, slope * top + offset], label=f"fit {slope:.2f} x + {offset:.2f} s")
    ax.plot([0, top], [1, top + 1], linestyle="--", color="grey", label="goal: keep-alive + 1 s")
    ax.plot([0, top], [1, 1.5 * top + 1], linestyle=":", color="black", label="kernel floor: 1.5 x keep-alive + 1 s")
    ax.set(title="stall against keep-alive timeout", xlabel="keepAliveTmo (s)", ylabel="stall (s)")
    ax.legend(fontsize=7)


def scaling(ax: Axes, doc: Doc) -> None:
    medians = doc["scaling"]["stage_median_ms"]
    levels = sorted(medians, key=int)
    ax.plot([int(k) for k in levels], [float(medians[k]) for k in levels], marker="o")
    base = float(medians[levels[0]])
    ax.axhline(base * 1.5, linestyle="--", color="grey", label="goal: 1.5x of none")
    ax.set(
        title="NodeStage+NodePublish with other controllers",
        xlabel="other NVMe controllers on the node",
        ylabel="median ms",
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def concurrency(ax: Axes, doc: Doc) -> None:
    n = int(doc["concurrency"])
    ax.bar(["1 client", f"{n} clients"], [float(doc["cycles_per_s_1"]), float(doc["cycles_per_s_n"])])
    ax.set(title=f"provisioning throughput ({doc['concurrency_speedup']}x)", ylabel="create+delete per s")


def resources(ax: Axes, docs: Mapping[str, Doc]) -> None:
    drawn = False
    for label, samples in (
        ("agent", docs.get("provision", {}).get("resources")),
        ("node plugin", docs.get("node", {}).get("resources", {}).get("samples")),
    ):
        if samples:
            ax.plot([s[0] for s in samples], [s[1] / 1024 for s in samples], marker=".", label=f"{label} RSS")
            drawn = True
    if not drawn:
        raise KeyError("resources")
    ax.set(title="RSS over cycles", xlabel="cycles", ylabel="MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def datapath(ax: Axes, doc: Doc) -> None:
    ratio = doc["datapath"]["ratio"]
    jobs = list(ratio["block"])
    shown = [t for t in ("block", "mount", "ext4") if t in ratio]  # ext4: made by hand, no driver
    width = 0.8 / len(shown)
    for i, target in enumerate(shown):
        ax.bar(
            [j + i * width for j in range(len(jobs))],
            [float(ratio[target][job]) for job in jobs],
            width,
            label="hand-made ext4 (no driver)" if target == "ext4" else f"published {target}",
        )
    ax.axhline(0.98, linestyle="--", color="grey", label="goal 0.98")
    ax.set_xticks([j + width * (len(shown) - 1) / 2 for j in range(len(jobs))], jobs, fontsize=7)
    ax.set(title="fio through the driver / raw namespace", ylabel="ratio")
    ax.legend(fontsize=7)


def qos(ax: Axes, doc: Doc) -> None:
    limits = doc["limits"]
    for kind in ("read", "write"):
        ax.scatter(
            [float(x[f"{kind}_limit"]) for x in limits], [float(x[f"{kind}_achieved"]) for x in limits], label=kind
        )
    top = max(float(x[f"{k}_limit"]) for x in limits for k in ("read", "write")) * 1.1
    ax.plot([0, top], [0, top], linestyle="--", color="grey", label="achieved = limit")
    ax.set(title="QoS: achieved IOPS against the limit", xlabel="limit", ylabel="achieved")
    ax.legend(fontsize=7)


def scale_agent(ax: Axes, doc: Doc) -> None:
    rows = doc["levels"]
    xs = [max(1, int(r["volumes"])) for r in rows]  # 0 volumes drawn at 1 on the log axis
    for key, label in (("create_p50_ms", "create p50"), ("create_p99_ms", "create p99"),
                       ("delete_p50_ms", "delete p50"), ("delete_p99_ms", "delete p99")):  # fmt: skip
        ax.plot(xs, [float(r[key]) for r in rows], marker="o", label=label)
    ax.plot(xs, [max(float(v) for v in r["list_page_ms"].values()) for r in rows], marker="s", label="list page")
    ax.axhline(float(rows[0]["create_p50_ms"]) * 1.2, linestyle="--", color="grey", label="goal: 1.2x create p50")
    ax.set_xscale("log")
    ax.set(title="agent: cost against volumes held", xlabel="volumes already there (0 drawn at 1)", ylabel="ms")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def scale_agent_lab(ax: Axes, doc: Doc) -> None:
    """On the kernel's nvmet configfs: the agent's create beside the scripts (the kernel's own growth) and the
    agent's part above its own system calls."""
    rows = doc["levels"]
    xs = [int(r["volumes"]) for r in rows]
    for key, label in (("create_p50_ms", "agent create p50"), ("contract_create_p50_ms", "its system calls (script)"),
                       ("raw_create_p50_ms", "durable configfs script")):  # fmt: skip
        ax.plot(xs, [float(r[key]) for r in rows], marker="o", label=label)
    own = [float(r["create_p50_ms"]) - float(r["contract_create_p50_ms"]) for r in rows]
    ax.plot(xs, own, marker="s", linestyle=":", label="agent above its system calls")
    ax.axhline(own[0] * 1.2, linestyle="--", color="grey", label="goal: 1.2x the agent's own part")
    ax.set(title="agent on real nvmet configfs: create against volumes held", xlabel="volumes already there",
           ylabel="ms")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def scale_controller(ax: Axes, doc: Doc) -> None:
    rows = doc["fleets"]
    xs = [int(r["agents"]) for r in rows]
    for key, label in (("create_p50_ms", "CreateVolume p50"), ("create_p99_ms", "CreateVolume p99"),
                       ("delete_p50_ms", "DeleteVolume p50")):  # fmt: skip
        ax.plot(xs, [float(r[key]) for r in rows], marker="o", label=label)
    if all("direct_create_p50_ms" in r for r in rows):
        ax.plot(
            xs, [float(r["direct_create_p50_ms"]) for r in rows], marker="s", label="its agent calls, no controller"
        )
    dead = doc.get("one_dead") or {}
    if dead:
        ax.scatter([int(dead["agents"])], [float(dead["create_p50_ms"])], marker="x", s=60, label="p50, one agent dead")
    ax.axhline(float(rows[0]["create_p50_ms"]) * 1.2, linestyle="--", color="grey", label="goal: 1.2x one agent")
    ax.set_xscale("log", base=2)
    ax.set(title="controller: cost against agents in the fabric map", xlabel="agents", ylabel="ms")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def scale_node(ax: Axes, doc: Doc) -> None:
    rows = doc["levels"]
    xs = [int(r["volumes"]) for r in rows]
    for key, label in (("pass_ms_per_volume", "reconcile pass per volume"), ("stats_ms", "NodeGetVolumeStats"),
                       ("stage_publish_p50_ms", "stage+publish / 10"),
                       ("unpublish_unstage_p50_ms", "unpublish+unstage / 10")):  # fmt: skip
        scale = 10 if key.endswith("_p50_ms") else 1
        ax.plot(xs, [float(r[key]) / scale for r in rows], marker="o", label=label)
    ax.set(title="node: cost against volumes published", xlabel="volumes published", ylabel="ms")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def curves(docs: Mapping[str, Doc], png: Path) -> None:
    panels: list[tuple[str, Callable[[Axes], None]]] = [
        ("pathloss", lambda ax: timeline(ax, docs["pathloss"])),
        ("pathloss", lambda ax: stall_fit(ax, docs["pathloss"])),
        ("node", lambda ax: scaling(ax, docs["node"])),
        ("provision", lambda ax: concurrency(ax, docs["provision"])),
        ("provision/node", lambda ax: resources(ax, docs)),
        ("node", lambda ax: datapath(ax, docs["node"])),
        ("qos", lambda ax: qos(ax, docs["qos"])),
        ("scale-agent", lambda ax: scale_agent(ax, docs["scale-agent"])),
        ("scale-agent-lab", lambda ax: scale_agent_lab(ax, docs["scale-agent-lab"])),
        ("scale-controller", lambda ax: scale_controller(ax, docs["scale-controller"])),
        ("scale-node", lambda ax: scale_node(ax, docs["scale-node"])),
    ]
    fig, axes = plt.subplots(6, 2, figsize=(13, 24))
    flat = list(axes.flat)
    for ax, (source, draw) in zip(flat, panels, strict=False):
        try:
            draw(ax)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
            ax.clear()
            ax.text(0.5, 0.5, f"not measured (bench-{source}.json)", ha="center", va="center")
            ax.set_axis_off()
    for ax in flat[len(panels) :]:
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(png, dpi=90, bbox_inches="tight")
    plt.close(fig)
