"""What ``./dev test`` asks of a tier's results, in two commands.

``python .ci/tiers.py skipped FILE``
    exit 1 (with a line saying so) when the JUnit file FILE holds tests and every one of them was skipped: under
    ``CI=true`` a tier that proved nothing fails the run, as one that collected nothing does.

``python .ci/tiers.py table RESULTS BUDGETS``
    RESULTS/ci-times.tsv holds one ``name<TAB>seconds<TAB>status`` line per tier, set-up step or wait for a
    background build, and one per background build (status ``background``: shown, not added to the total, as it
    overlapped the tiers; likewise status ``beside`` or ``beside-FAILED``: a tier run in the background beside
    another, which holds that time), as ``./dev test`` appended them; BUDGETS is ``name:seconds ...`` (declared
    once, next to the tier list in ``./dev``). Prints
    each tier's wall time against its budget and the total, a warning line for every tier more than 20 % over
    its budget, and writes the same rows to RESULTS/ci-times.json (one run; kept for plotting trends).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from summary import counts  # the JUnit counting of .ci/summary.py (this folder is on the path)

OVER = 1.2  # a tier this far over its budget gets a warning line


def skipped(path: Path) -> int:
    passed, failed, skip = counts(path)
    tests = passed + failed + skip
    if tests and skip == tests:
        print(
            f"tier {path.stem.removeprefix('pytest-')}: all {tests} tests skipped (CI=true: a tier that proved"
            " nothing fails the run)",
            file=sys.stderr,
        )
        return 1
    return 0


def budgets(spec: str) -> dict[str, float]:
    out = {}
    for item in spec.split():
        name, _, seconds = item.partition(":")
        out[name] = float(seconds)
    return out


def rows(tsv: Path, budget: dict[str, float]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for line in tsv.read_text().splitlines():
        name, seconds, status = line.split("\t")
        out.append({"tier": name, "seconds": round(float(seconds), 1), "budget_s": budget.get(name), "status": status})
    return out


def minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:5.1f}"


def table(results: Path, spec: str) -> int:
    budget = budgets(spec)
    tsv = results / "ci-times.tsv"
    found = rows(tsv, budget) if tsv.exists() else []
    counted = [r for r in found if r["status"] != "background" and not str(r["status"]).startswith("beside")]
    total = sum(float(str(r["seconds"])) for r in counted)
    planned = sum(b for b in (r["budget_s"] for r in found) if isinstance(b, float))
    print(f"{'tier':14} {'min':>6} {'budget':>7}  status")
    warnings = []
    for r in found:
        seconds, limit = float(str(r["seconds"])), r["budget_s"]
        flag = ""
        if isinstance(limit, float) and seconds > OVER * limit:
            flag = "  OVER"
            warnings.append(
                f"warning: tier {r['tier']} took {seconds / 60:.1f} min, more than 20 % over its budget"
                f" of {limit / 60:.1f} min"
            )
        print(
            f"{r['tier']!s:14} {minutes(seconds):>6} {minutes(limit if isinstance(limit, float) else None):>7}"
            f"  {r['status']}{flag}"
        )
    print(f"{'total':14} {minutes(total):>6} {minutes(planned):>7}")
    for line in warnings:
        print(line)
    doc = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "total_s": round(total, 1),
        "budget_s": planned,
        "tiers": found,
    }
    (results / "ci-times.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "skipped":
        return skipped(Path(argv[1]))
    if len(argv) == 3 and argv[0] == "table":
        return table(Path(argv[1]), argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
