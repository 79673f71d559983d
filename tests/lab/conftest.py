"""The lab tier: one VM for the whole session, per-test cleanup, reporting and the QEMU leak check (all in
``tests.support.lab``)."""

from tests.support.lab import fabric, kernel_release, lab_vm, pytest_sessionfinish, report

__all__ = ["fabric", "kernel_release", "lab_vm", "pytest_sessionfinish", "report"]
