"""``nvmeof-csi demo``: run the end-to-end demo in the fabric lab (a source checkout's ``lab/`` package) and
print its report. Exit code 0 only when every check of the demo held."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table


def _render(console: Console, doc: dict[str, Any]) -> None:
    phases = Table(title="nvmeof-csi demo: phases", show_lines=False)
    phases.add_column("phase")
    phases.add_column("seconds", justify="right")
    for name, seconds in doc["phases"]:
        phases.add_row(name, f"{seconds:.2f}")
    console.print(phases)
    checks = Table(title="checks")
    for col in ("check", "result", "detail"):
        checks.add_column(col)
    for name, ok, detail in doc["checks"]:
        checks.add_row(name, "[green]ok[/]" if ok else "[red]FAILED[/]", detail)
    console.print(checks)
    console.print(f"ANA before failover: {doc['ana_before']}")
    console.print(f"ANA after failover:  {doc['ana_after']}")
    console.print(f"bytes written {doc['bytes_written']:,}, verified {doc['bytes_verified']:,}; "
                  f"capacity {doc['capacity_before']:,} -> {doc['capacity_after']:,} bytes")
    if doc["error"]:
        console.print(f"[red]demo failed:[/] {doc['error']}")
    console.print("[green]demo: success[/]" if doc["ok"] else "[red]demo: FAILED[/]")


def demo_command(
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON to this file.")
    ] = None,
    size_mib: Annotated[int, typer.Option(min=64, max=4096, help="Volume size before expansion (MiB).")] = 512,
    files: Annotated[int, typer.Option(min=1, max=1024, help="Files of 1 MiB in the data set.")] = 64,
) -> None:
    """Boot the fabric lab (QEMU, stock Debian kernel) and run agent, controller and node in it: provision,
    stage, publish, write a data set, fail a path over under I/O, read it all back, expand; print a report.
    Needs root and a source checkout (the lab/ package, built by ./dev setup)."""
    console = Console()
    checkout = Path(__file__).resolve().parent.parent  # an editable install runs from the source checkout
    if (checkout / "lab" / "__init__.py").is_file() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        from lab.demo import run_demo  # noqa: PLC0415 -- the lab is a source-checkout tool, not a dependency
    except ImportError as exc:
        console.print(f"nvmeof-csi demo needs a source checkout with the lab/ package ({exc})")
        raise typer.Exit(2) from exc
    report = run_demo(say=lambda line: console.print(f"[dim]demo:[/] {line}"), size_mib=size_mib, files=files)
    doc = report.to_json()
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
    _render(console, doc)
    raise typer.Exit(0 if report.ok else 1)
