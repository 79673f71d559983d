""".ci/tiers.py: the budget table of ./dev test and the all-skipped check of CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.env import ROOT

TIERS = ROOT / ".ci" / "tiers.py"


def tiers(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TIERS), *args], capture_output=True, text=True, timeout=60, check=False)


def test_the_table_warns_only_past_twenty_percent_and_keeps_background_builds_and_beside_tiers_out_of_the_total(
    tmp_path: Path,
) -> None:
    (tmp_path / "ci-times.tsv").write_text(
        "setup\t20\tok\nunit\t36\tok\nbuild-kube\t900\tbackground\nlint\t73\tFAILED\nwait-kube\t30\tok\n"
        "demo\t50\tbeside\nlab\t40\tbeside-FAILED\n"
    )
    out = tiers("table", str(tmp_path), "unit:30 lint:60 k8s:600")
    assert out.returncode == 0, out.stderr
    warnings = [ln for ln in out.stdout.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: tier lint took 1.2 min, more than 20 % over its budget of 1.0 min"]  # 36 s: 1.2x
    doc = json.loads((tmp_path / "ci-times.json").read_text())
    assert doc["total_s"] == 20 + 36 + 73 + 30 and doc["budget_s"] == 90
    assert [r["tier"] for r in doc["tiers"]] == ["setup", "unit", "build-kube", "lint", "wait-kube", "demo", "lab"]
    assert doc["tiers"][3] == {"tier": "lint", "seconds": 73.0, "budget_s": 60.0, "status": "FAILED"}


def junit(path: Path, tests: int, skipped: int) -> Path:
    path.write_text(
        f'<testsuites><testsuite name="t" tests="{tests}" skipped="{skipped}" failures="0" errors="0">'
        "</testsuite></testsuites>"
    )
    return path


def test_a_tier_whose_every_test_skipped_is_refused_and_one_that_ran_something_is_not(tmp_path: Path) -> None:
    refused = tiers("skipped", str(junit(tmp_path / "pytest-lab.xml", 4, 4)))
    assert refused.returncode == 1 and "tier lab: all 4 tests skipped" in refused.stderr
    assert tiers("skipped", str(junit(tmp_path / "pytest-unit.xml", 4, 3))).returncode == 0
