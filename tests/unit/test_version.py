"""The version the driver reports (GetPluginInfo, the agent's API, ``--version``) is the one the package is built
with."""

from __future__ import annotations

import tomllib
from pathlib import Path

from nvmeof_csi import __version__

REPO = Path(__file__).resolve().parents[2]


def test_the_reported_version_is_pyprojects() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]
