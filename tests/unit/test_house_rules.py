"""Rules of the house that a linter does not check: small modules, and no shell anywhere."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 350


def python_files() -> list[Path]:
    """Every Python file git knows or would add (generated and ignored files left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).exists()]


def test_every_module_is_at_most_350_lines() -> None:
    files = python_files()
    assert len(files) > 100  # the listing itself worked
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: split them by subject"


def test_no_module_runs_a_shell() -> None:
    assert [
        str(f.relative_to(ROOT))
        for f in python_files()
        if "shell=True" in f.read_text() and f.name != "test_house_rules.py"
    ] == []
