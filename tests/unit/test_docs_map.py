"""The package map in docs/architecture.md is the tree: every package of ``nvmeof_csi`` has a row, every module
of a package is named in its row, and no row names a module that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "nvmeof_csi"
ROW = re.compile(r"^\| `([a-z_]+)/` \| (.*) \|$")
NAMED = re.compile(r"`([a-z_][a-z0-9_]*)`")


def _rows(text: str) -> dict[str, str]:
    section = text.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in map(ROW.match, section.splitlines()) if m}


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
        first_words = {m.group(1) for m in re.finditer(r"(?:^|, |: )`([a-z_][a-z0-9_]*)`", text)}
        gone = first_words - _modules(PACKAGE / name)
        assert not gone, f"{name}/: docs/architecture.md names modules that are not in the tree: {sorted(gone)}"


def test_bench_readme_names_the_mode_ci_runs() -> None:
    dev = (REPO / "dev").read_text()
    mode = re.search(r"-m bench\.suite (--[a-z]+)", dev)
    assert mode, "./dev runs no bench.suite mode"
    readme = (REPO / "bench" / "README.md").read_text()
    said = re.search(r"CI bench tier runs `bench\.suite (--[a-z]+)`", readme)
    assert said and said.group(1) == mode.group(1), (said and said.group(1), mode.group(1))
