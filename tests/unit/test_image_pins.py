"""The image ships pinned Python dependencies: ``image/constraints.txt`` pins every distribution the base's venv
installs (each a NAME==VERSION that satisfies ``pyproject.toml``'s range), and the base build refuses anything it
installed that is not pinned there (``image.base.unpinned``)."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement

from image.base import ImageError, dependencies, normalized, pinned, unpinned


def test_every_dependency_of_the_driver_is_pinned_within_its_range() -> None:
    pins = pinned()
    for dependency in dependencies():
        requirement = Requirement(dependency)
        version = pins.get(normalized(requirement.name))
        assert version is not None, f"{requirement.name} is not pinned in image/constraints.txt"
        assert requirement.specifier.contains(version, prereleases=True), (dependency, version)


def test_what_the_build_installed_must_be_pinned_at_that_version() -> None:
    pins = {"grpcio": "1.85.1", "rich": "15.0.0"}
    unpinned({"grpcio": "1.85.1", "rich": "15.0.0"}, pins)
    with pytest.raises(ImageError, match=r"not pinned in image/constraints.txt: newdep==1.0, rich==15.1.0"):
        unpinned({"grpcio": "1.85.1", "rich": "15.1.0", "newdep": "1.0"}, pins)


def test_names_are_compared_normalized() -> None:
    assert normalized("Typing_Extensions") == normalized("typing-extensions") == normalized("typing.extensions")
