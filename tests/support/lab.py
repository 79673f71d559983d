"""The lab tier: one VM for the whole session, per-test cleanup of configfs, controllers, tc and mounts.
Under CI=true a lab that cannot start fails the run instead of skipping it. After the session, no lab QEMU
process may remain (checked in ``pytest_sessionfinish``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from lab import BuildError, BuildInfo, Fabric, LabError, LabVM, lab_qemu_pids
from tests.support.env import in_ci, need

T = TypeVar("T")


def start_lab(start: Callable[[], T], what: str) -> T:
    """``start()`` once the lab is built (else skipped as not built); a lab that cannot start fails the run under
    CI=true and skips it elsewhere."""
    try:
        BuildInfo.load()
    except BuildError as err:
        need(False, str(err))
    try:
        return start()
    except LabError as err:
        if in_ci():
            pytest.fail(f"{what} did not start: {err}")
        pytest.skip(f"{what} did not start: {err}")


@pytest.fixture(scope="session")
def lab_vm() -> Iterator[LabVM]:
    vm = start_lab(lambda: LabVM().start(), "lab VM")
    Fabric(vm).load(rdma=True)
    try:
        yield vm
    finally:
        vm.close()


@pytest.fixture(scope="session")
def kernel_release(lab_vm: LabVM) -> str:
    """The running lab kernel (``uname -r`` in the guest)."""
    return lab_vm.check(["uname", "-r"], timeout=10).strip()


@pytest.fixture
def fabric(lab_vm: LabVM) -> Iterator[Fabric]:
    fab = Fabric(lab_vm)
    fab.clear()
    yield fab
    fab.clear()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = lab_qemu_pids(parent=os.getpid())
    if left:
        print(f"\nlab: QEMU processes outlived the test run: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def report(
    capsys: pytest.CaptureFixture[str], record_property: Callable[[str, object], None]
) -> Callable[[str, str], None]:
    """Show a measurement in the test output (even when the test passes) and record it in the JUnit XML."""

    def emit(name: str, value: str) -> None:
        record_property(name, value)
        with capsys.disabled():
            print(f"\nlab: {name}: {value}", flush=True)

    return emit
