"""Our Grafana dashboard (``deploy/grafana/nvmeof-csi.json``) as the tests see it: every panel's PromQL with the
dashboard variables replaced as Grafana would (``$volume``/``$agent`` = All, ``$__rate_interval`` = a window
that fits the test's scrape interval), and key panels drawn to PNG from Prometheus ``query_range`` results."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from lab.prometheus import HostPrometheus

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "nvmeof-csi.json"
DATASET_PANELS = ("Cache hit ratio (last hydration)", "Hydrated bytes by source")


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    expr: str
    legend: str
    unit: str


def panel_queries(rate_interval: str, dashboard: Path = DASHBOARD) -> list[PanelQuery]:
    doc = json.loads(dashboard.read_text())
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            expr = (
                target["expr"]
                .replace("$__rate_interval", rate_interval)
                .replace('"$volume"', '".*"')
                .replace('"$agent"', '".*"')
            )
            out.append(
                PanelQuery(
                    panel["title"],
                    expr,
                    target.get("legendFormat", ""),
                    panel["fieldConfig"]["defaults"].get("unit", "short"),
                )
            )
    return out


def has_data(result: list[dict[str, Any]]) -> bool:
    """True when a query_range result holds at least one finite sample."""
    return any(math.isfinite(float(v)) for series in result for _, v in series.get("values", []))


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def render(
    title: str,
    queries: list[PanelQuery],
    results: dict[str, list[dict[str, Any]]],
    start: float,
    out: Path,
    marks: dict[str, float] | None = None,
) -> Path:
    """One panel as a PNG: each series of each query a line over seconds since ``start``; ``marks`` are
    vertical lines (e.g. when a path was lost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=100)
    for query in queries:
        for series in results.get(query.expr, []):
            points = [(float(t) - start, float(v)) for t, v in series["values"] if math.isfinite(float(v))]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=legend(query.legend, series["metric"])[:60] or query.expr[:60])
    for label, at in (marks or {}).items():
        ax.axvline(at - start, color="grey", linestyle="--", linewidth=1)
        ax.annotate(
            label, (at - start, 1), xycoords=("data", "axes fraction"), fontsize=8, rotation=90, va="top", ha="right"
        )
    ax.set_title(title)
    ax.set_xlabel("seconds")
    ax.set_ylabel(queries[0].unit if queries else "")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


@contextmanager
def scraped(registry: CollectorRegistry, work: Path, job: str = "nvmeof-csi-agent") -> Iterator[HostPrometheus]:
    """A real Prometheus on this host scraping ``registry`` (served on a loopback port) every second."""
    httpd, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    prom = HostPrometheus(work, {job: f"127.0.0.1:{httpd.server_port}"}, interval="1s")
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
        httpd.shutdown()
        httpd.server_close()
