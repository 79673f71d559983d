"""``nvmeof-csi demo``: run the end-to-end demo in the fabric lab (``python -m lab.demo`` in the source
checkout, as a child process: the lab is a development tool, not a dependency of the driver) and print its
report. Exit code 0 only when every check of the demo held."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console


def _render(console: Console, doc: dict[str, Any]) -> None:
    from rich.table import Table  # noqa: PLC0415 - see demo_command

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
    console.print(
        f"bytes written {doc['bytes_written']:,}, verified {doc['bytes_verified']:,}; "
        f"capacity {doc['capacity_before']:,} -> {doc['capacity_after']:,} bytes"
    )
    if doc["error"]:
        console.print(f"[red]demo failed:[/] {doc['error']}")
    console.print("[green]demo: success[/]" if doc["ok"] else "[red]demo: FAILED[/]")


def demo_command(
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON to this file.")] = None,
    size_mib: Annotated[int, typer.Option(min=64, max=4096, help="Volume size before expansion (MiB).")] = 512,
    files: Annotated[int, typer.Option(min=1, max=1024, help="Files of 1 MiB in the data set.")] = 64,
) -> None:
    """Boot the fabric lab (QEMU, stock Debian kernel) and run agent, controller and node in it: provision,
    stage, publish, write a data set, fail a path over under I/O, read it all back, expand; print a report.
    Needs root and a source checkout (the lab/ package, built by ./dev setup)."""
    from rich.console import Console  # noqa: PLC0415 - rich is loaded by the command that prints with it only

    console = Console()
    checkout = Path(__file__).resolve().parents[2]  # an editable install runs from the source checkout
    if not (checkout / "lab" / "demo.py").is_file():
        console.print(f"nvmeof-csi demo needs a source checkout with the lab/ package (looked in {checkout})")
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory(prefix="nvmeof-demo-") as tmp:
        report_path = json_out.absolute() if json_out is not None else Path(tmp) / "demo.json"
        argv = [
            sys.executable,
            "-m",
            "lab.demo",
            "--json",
            str(report_path),
            "--size-mib",
            str(size_mib),
            "--files",
            str(files),
        ]
        rc = subprocess.run(argv, cwd=checkout, check=False).returncode  # the lab is a tool, not a dependency
        if not report_path.is_file():
            console.print(f"[red]demo: FAILED[/] (the lab exited {rc} without a report)")
            raise typer.Exit(1)
        doc = json.loads(report_path.read_text())
    _render(console, doc)
    raise typer.Exit(0 if doc["ok"] and rc == 0 else 1)
