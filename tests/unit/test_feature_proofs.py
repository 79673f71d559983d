"""Every row of the README's feature table names the tests that prove it, and each named test exists: a file
under ``tests/``, and where a ``::name`` follows, a test function of that name in it (a renamed or removed proof
fails here, not silently in the README)."""

from __future__ import annotations

import ast
import re

from tests.support.env import ROOT

NAMED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def feature_rows() -> list[list[str]]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("| what | how a user asks for it | details | proven by |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_every_feature_row_names_its_proofs_and_each_exists() -> None:
    rows = feature_rows()
    assert len(rows) >= 14
    missing = []
    for row in rows:
        named = NAMED.findall(row[-1])
        assert named, f"feature {row[0][:60]!r} names no test in its 'proven by' column"
        for path, function in named:
            file = ROOT / path
            if not file.is_file():
                missing.append(path)
                continue
            tree = ast.parse(file.read_text())
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            if function and function not in defined:
                missing.append(f"{path}::{function}")
    assert not missing, f"the README names tests that do not exist: {missing}"
