"""apt for one Debian suite without touching the host's apt setup: its package lists and downloads live in a
folder of the caller's (the lab's kernels from bookworm-backports, ``tlshd`` from trixie)."""

from __future__ import annotations

from pathlib import Path


class ToolError(RuntimeError):
    """A tool could not be fetched or unpacked; the message names the step."""


def apt_options(suite: str, cache: Path) -> list[str]:
    """apt options that read only ``suite`` of the Debian archive, with lists and downloads under ``cache``
    (nothing of the host's apt configuration changes). No options for the host's own sources (``""``)."""
    if not suite:
        return []
    root = cache / f"apt-{suite}"
    for folder in (root / "lists" / "partial", root / "archives" / "partial"):
        folder.mkdir(parents=True, exist_ok=True)
    sources = root / "sources.list"
    sources.write_text(
        f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {suite} main\n"
    )
    return [
        "-o",
        f"Dir::Etc::SourceList={sources}",
        "-o",
        "Dir::Etc::SourceParts=/dev/null",
        "-o",
        f"Dir::State::Lists={root / 'lists'}",
        "-o",
        f"Dir::Cache={root}",
        "-o",
        f"Dir::Cache::Archives={root / 'archives'}",
    ]
