"""Settings every tier shares.

Hypothesis runs without its per-example deadline: a deadline is a timing assertion, and on a machine whose other
core runs a TCG lab VM (or a background build) an ordinary example can take longer than 200 ms. Property tests
assert behaviour; the fuzz tier sets its own example counts."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("nvmeof-csi", deadline=None)
settings.load_profile("nvmeof-csi")
