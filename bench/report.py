"""The benchmark report a person reads: every figure of the performance goals, its measured value from
``results/bench-*.json``, its goal and whether it holds, as ``results/bench-report.md`` with a PNG of each
figure's distance from its goal (``results/bench-goals.png``).

Contract: reads only what the benchmarks wrote; a figure whose benchmark did not run (or does not exist yet)
is listed as "not measured", never guessed. Exit status 0 whatever the figures say (goals are reported, not
enforced: a benchmark fails its own run only on I/O errors). Usage: ``python -m bench.report [results]``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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


FIGURES = (
    Figure("provision create+delete, agent vs raw configfs script", "provision",
           lambda d: float(d["ratio_total"]), 1.25, False),
    Figure("NodeStage+NodePublish vs bare connect/mkfs/mount", "stage", lambda d: float(d["ratio_median"]), 1.15,
           False),
    Figure("dataset hydration, cold / warm", "dataset", lambda d: float(d["ratio_cold_over_warm"]), 3.0, True),
    Figure("dataset warm hydration from cache (lowest round)", "dataset",
           lambda d: 100 * min(float(x) for x in d["hit_ratio_warm"]), 90.0, True, "%"),
    Figure("QoS achieved IOPS vs limit, worst error", "qos", lambda d: worst(d["worst_error_pct"]), 5.0, False, "%"),
    Figure("QoS ModifyVolume reply to io.max in force", "qos", lambda d: worst(d["modify_to_in_force_s"]), 2.0,
           False, "s"),
    Figure("QoS I/O errors", "qos", lambda d: float(d["io_errors"]), 0.0, False, ""),
)

NOT_YET = (
    "provisioning throughput, 16 concurrent clients vs 1 (goal ≥ 4x)",
    "data path: fio 4k random r/w QD16 and 128k sequential, published mount and block vs raw namespace (≥ 0.98x)",
    "unplanned path loss with the documented defaults (≤ keep-alive + 1 s, 0 errors)",
    "stage latency with 64 and 128 other controllers vs none (≤ 1.5x)",
    "node plugin and agent RSS and open files over 500 cycles (flat)",
)


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
    fig, ax = plt.subplots(figsize=(10, 0.55 * max(len(measured), 1) + 1.4))
    names = [f.name for f, _ in measured]
    margins = [min(f.margin(v), 5.0) for f, v in measured]
    colours = ["tab:green" if f.holds(v) else "tab:red" for f, v in measured]
    ax.barh(names, margins, color=colours)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("goal / measured (oriented: right of the dashed line = goal holds; capped at 5)")
    ax.invert_yaxis()
    ax.set_title("nvmeof-csi benchmarks against their goals")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def render(rows: list[tuple[Figure, float | None]], docs: Mapping[str, Doc]) -> str:
    lines = ["# Benchmark report", "",
             "Ratios against a baseline run side by side in the same run (TCG lab: absolute times mean little).",
             "", "![figures against goals](bench-goals.png)", "",
             "| figure | measured | goal | holds |", "|---|---|---|---|"]
    for fig, v in rows:
        sign = "≥" if fig.higher_is_better else "≤"
        shown = "not measured" if v is None else f"{v:g}{fig.unit}"
        verdict = "" if v is None else ("yes" if fig.holds(v) else "**no**")
        lines.append(f"| {fig.name} | {shown} | {sign} {fig.goal:g}{fig.unit} | {verdict} |")
    lines += ["", "Not measured by any benchmark yet:", ""] + [f"- {n}" for n in NOT_YET]
    lines += ["", "Runs: " + ", ".join(f"`bench-{k}.json`" for k in sorted(docs)) if docs else "", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results = Path(args[0]) if args else REPO / "results"
    docs = load(results)
    rows = measure(docs)
    plot(rows, results / "bench-goals.png")
    (results / "bench-report.md").write_text(render(rows, docs))
    held = sum(1 for f, v in rows if v is not None and f.holds(v))
    got = sum(1 for _, v in rows if v is not None)
    print(f"bench report: {held} of {got} measured figures meet their goal ({len(rows) - got} not measured, "
          f"{len(NOT_YET)} figures without a benchmark yet); {results / 'bench-report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
