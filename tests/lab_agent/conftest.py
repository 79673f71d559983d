"""The lab-agent tier reuses the lab tier's session VM, per-test cleanup, reporting and QEMU check."""

from tests.support.lab import fabric, kernel_release, lab_vm, pytest_sessionfinish, report

__all__ = ["fabric", "kernel_release", "lab_vm", "pytest_sessionfinish", "report"]
