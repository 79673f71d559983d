"""``nvmeofctl datasets``: dataset volumes per data set -- volumes, hydration progress, bytes from Alluxio's
cache vs. the under-store and the hit ratio (from the labels the agents record with each dataset volume)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nvmeof_csi.cli.context import state
from nvmeof_csi.cli.output import human_bytes, render
from nvmeof_csi.datasets.client import AlluxioRest
from nvmeof_csi.datasets.locality import bytes_by_host, node_label
from nvmeof_csi.nvmeof.dataset import DatasetSpec

app = typer.Typer(help="Dataset volumes (filled through Alluxio): progress and cache hit ratio.", no_args_is_help=True)
COLUMNS = ("dataset", "volumes", "hydrating", "bytes", "from_cache", "from_ufs", "hit_ratio", "cached_on")
Target = Annotated[str | None, typer.Option("--target", "-t", help="Only this target (name from the targets file).")]


def summarize(volumes: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """(target, agent Volume message) pairs -> one row per data set (its Alluxio path)."""
    rows: dict[str, dict[str, Any]] = {}
    for target, vol in volumes:
        path = vol.parameters.get("dataset.path") or vol.parameters.get("dataset.uri")
        if not path:
            continue
        row = rows.setdefault(
            path,
            {"dataset": path, "volumes": [], "hydrating": [], "_bytes": 0, "_cache": 0, "_ufs": 0, "cached_on": set()},
        )
        labels = vol.labels
        if "dataset.progress" in labels or vol.status == "creating":
            row["hydrating"].append(f"{target}/{vol.name}: {labels.get('dataset.progress', 'starting')}")
            continue
        row["volumes"].append(f"{target}/{vol.name}")
        row["_bytes"] += int(labels.get("dataset.bytes", 0))
        row["_cache"] += int(labels.get("dataset.cacheBytes", 0))
        row["_ufs"] += int(labels.get("dataset.ufsBytes", 0))
        row["cached_on"].update(h for h in labels.get("dataset.workers", "").split(",") if h)
    out = []
    for row in rows.values():
        total = row.pop("_bytes")
        cache, ufs = row.pop("_cache"), row.pop("_ufs")
        row.update(
            bytes=human_bytes(total),
            from_cache=human_bytes(cache),
            from_ufs=human_bytes(ufs),
            hit_ratio=f"{cache / total:.3f}" if total else "-",
            cached_on=sorted(row["cached_on"]),
        )
        out.append(row)
    return sorted(out, key=lambda r: str(r["dataset"]))


@app.command("list")
def list_datasets(ctx: typer.Context, target: Target = None) -> None:
    """Every data set with dataset volumes: how many, which are still hydrating (with progress), and how
    much of their bytes came from Alluxio's cache."""
    cli = state(ctx)
    volumes = []
    for t in cli.pick(target):
        with cli.client(t) as client:
            volumes += [(t.name, v) for v in client.list_volumes()]
    render(summarize(volumes), COLUMNS, cli.output, title="datasets")


@app.command("labels")
def labels(
    ctx: typer.Context,
    path: Annotated[str, typer.Argument(help="The data set's Alluxio path (the StorageClass 'dataset.path').")],
    alluxio_proxy: Annotated[
        str, typer.Option("--alluxio-proxy", envvar="NVMEOF_CSI_ALLUXIO_PROXY", help="Alluxio REST proxy URL.")
    ],
) -> None:
    """Node labels a scheduler can use: for each Alluxio worker host caching the data set, the bytes it holds
    and the label (with the `kubectl label node` line) that marks the node as close to the data set."""
    spec = DatasetSpec(path)
    held = bytes_by_host(AlluxioRest(alluxio_proxy, ""), spec.path)
    key = node_label(spec)
    rows = [
        {
            "host": host,
            "cached": human_bytes(size),
            "label": f"{key}=cached",
            "command": f"kubectl label node {host} --overwrite {key}=cached",
        }
        for host, size in sorted(held.items(), key=lambda item: -item[1])
    ]
    render(rows, ("host", "cached", "label", "command"), state(ctx).output, title=f"where {path} is cached")
