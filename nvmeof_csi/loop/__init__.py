"""The development-only loop backend: volumes as sparse files, "connected" with losetup."""
