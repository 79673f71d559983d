"""The Dockerfile builds from base images pinned by digest only: every FROM names a build argument (or an
earlier stage), and the first stage refuses a base reference without ``@sha256:<64 hex>`` — the guard itself is
run here with sh against good and bad references (no Docker engine needed)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.env import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
DIGEST = "sha256:" + "0123456789abcdef" * 4


def guard() -> str:
    """The digest guard's shell, as the Dockerfile runs it (continuation lines joined)."""
    joined = DOCKERFILE.replace("\\\n", " ")
    line = next(li for li in joined.splitlines() if li.startswith("RUN for ref in"))
    return line.removeprefix("RUN ")


def test_every_stage_builds_from_an_argument_or_an_earlier_stage() -> None:
    stages, bases = [], re.findall(r"^FROM (\S+)(?: AS (\S+))?", DOCKERFILE, re.MULTILINE)
    for base, name in bases:
        assert base.startswith("${") or base in stages, f"FROM {base}: not pinned through a digest argument"
        stages.append(name)
    assert [b for b, _ in bases if b.startswith("${")] == ["${GO_IMAGE}", "${BASE_IMAGE}"]


@pytest.mark.parametrize(
    ("go", "base", "ok"),
    [
        (f"golang:1.26-bookworm@{DIGEST}", f"debian:bookworm-slim@{DIGEST}", True),
        ("golang:1.26-bookworm", f"debian:bookworm-slim@{DIGEST}", False),
        (f"golang:1.26-bookworm@{DIGEST}", "debian:bookworm-slim", False),
        (f"golang@{DIGEST[:-1]}", f"debian@{DIGEST}", False),
        ("", "", False),
    ],
)
def test_the_guard_refuses_a_base_without_a_digest(go: str, base: str, ok: bool) -> None:
    run = subprocess.run(
        ["sh", "-c", guard()], env={"GO_IMAGE": go, "BASE_IMAGE": base}, capture_output=True, text=True, check=False
    )
    assert (run.returncode == 0) is ok, run.stderr
    if not ok:
        assert "is not pinned by digest" in run.stderr
