"""The lab-agent tier reuses the lab tier's session VM, per-test cleanup, reporting and QEMU check; each test
gets a fresh agent on real configfs with two TCP portals (``agent``)."""

from collections.abc import Iterator

import pytest

from lab import Fabric, LabVM, Portal
from lab.target import GuestTargetAgent
from tests.support.lab import fabric, kernel_release, lab_vm, pytest_sessionfinish, report

__all__ = ["agent", "fabric", "kernel_release", "lab_vm", "pytest_sessionfinish", "report"]
P1 = Portal(1, "tcp", "127.0.0.1", 4420)
P2 = Portal(2, "tcp", "127.0.0.2", 4421)


@pytest.fixture
def agent(lab_vm: LabVM, fabric: Fabric) -> Iterator[GuestTargetAgent]:
    ga = GuestTargetAgent(lab_vm, [P1, P2], groups=["a", "b"])
    ga.wipe()
    ga.start()
    yield ga
    ga.stop()
    fabric.clear()
    ga.wipe()
