"""The package map in docs/architecture.md is the tree: every package of ``nvmeof_csi`` has a heading
(``**`name/`**``), every module of a package has a bullet under it (``- `module`: what it is``, or
``- `a` and `b`: ...``), and no bullet names a module that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "nvmeof_csi"
HEADING = re.compile(r"^\*\*`([a-z_]+)/`\*\*")
NAMED = re.compile(r"`([a-z_][a-z0-9_]*)`")


def _rows(text: str) -> dict[str, str]:
    """package -> the head of each of its bullets (the module names before the ``:``), one per line."""
    section = text.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    package = ""
    for line in section.splitlines():
        heading = HEADING.match(line)
        if heading:
            package = heading.group(1)
            rows[package] = ""
        elif line.startswith("- ") and package:
            rows[package] += line[2:].split(": ", 1)[0] + "\n"
    return rows


def _modules(package: Path) -> set[str]:
    return {p.stem for p in package.glob("*.py") if p.stem != "__init__"}


def test_every_package_and_module_is_on_the_map() -> None:
    rows = _rows((REPO / "docs" / "architecture.md").read_text())
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "gen"}
    assert packages - set(rows) == set(), "packages without a row in docs/architecture.md"
    assert set(rows) - packages - {"gen"} == set(), "rows for packages that are gone"
    for name in sorted(packages):
        named = set(NAMED.findall(rows[name]))
        missing = _modules(PACKAGE / name) - named
        assert not missing, f"{name}/: modules not named in docs/architecture.md: {sorted(missing)}"


def test_no_row_names_a_module_that_is_gone() -> None:
    rows = _rows((REPO / "docs" / "architecture.md").read_text())
    for name, text in rows.items():
        if name == "gen":
            continue
        first_words = set(NAMED.findall(text))
        gone = first_words - _modules(PACKAGE / name)
        assert not gone, f"{name}/: docs/architecture.md names modules that are not in the tree: {sorted(gone)}"


def test_bench_readme_names_the_mode_ci_runs() -> None:
    dev = (REPO / "dev").read_text()
    mode = re.search(r"-m bench\.suite (--[a-z]+)", dev)
    assert mode, "./dev runs no bench.suite mode"
    readme = (REPO / "bench" / "README.md").read_text()
    said = re.search(r"CI bench tier runs `bench\.suite (--[a-z]+)`", readme)
    assert said and said.group(1) == mode.group(1), (said and said.group(1), mode.group(1))
