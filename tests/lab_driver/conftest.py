"""The lab-driver tier reuses the lab tier's session VM, reporting and QEMU check, and runs one driver stack
(agent + ``serve --mode all --backend nvmeof``) for the whole tier."""

from collections.abc import Iterator

import pytest

from lab import LabVM
from lab.stack import GuestDriver, running_stack
from tests.support.lab import kernel_release, lab_vm, pytest_sessionfinish, report

__all__ = ["kernel_release", "lab_vm", "pytest_sessionfinish", "report", "stack"]


@pytest.fixture(scope="session")
def stack(lab_vm: LabVM) -> Iterator[GuestDriver]:
    with running_stack(lab_vm, rdma=True, tls=True) as driver:  # TCP, soft-RoCE and TLS portals; tlshd
        yield driver
