"""Where every benchmark leaves its numbers: ``results/bench-<name>.json`` in the repository."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.build import REPO


def save(name: str, result: dict[str, Any]) -> Path:
    folder = REPO / "results"
    folder.mkdir(exist_ok=True)
    path = folder / f"bench-{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
