"""Backends other than the real NVMe-oF one. ``loop`` is for development only."""
