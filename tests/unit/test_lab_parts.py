"""Lab pieces that need no VM: the guest agent's command runner and file operations (run here on the host),
the probe's pattern, and the fabric helpers' argument checks."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from lab.fabric import Fabric
from tests.support.env import ROOT


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "lab" / "guest" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_agent_kills_the_whole_process_group_on_timeout() -> None:
    agent = load("agent")
    start = time.monotonic()
    res = agent.run_argv(["sh", "-c", "sleep 30 & sleep 30"], timeout=0.5)
    assert res["rc"] == -9 and "timeout" in res["err"]
    assert time.monotonic() - start < 10
    ok = agent.run_argv(["sh", "-c", "cat; echo err >&2; exit 3"], timeout=5, stdin="hello")
    assert (ok["rc"], ok["out"], ok["err"].strip()) == (3, "hello", "err")


def test_agent_file_ops_report_errno(tmp_path: Path) -> None:
    agent = load("agent")
    target = str(tmp_path / "a")
    assert agent.file_op({"op": "write", "path": target, "data": "x"})["rc"] == 0
    assert agent.file_op({"op": "read", "path": target})["out"] == "x"
    assert agent.file_op({"op": "symlink", "src": target, "path": str(tmp_path / "l")})["rc"] == 0
    assert agent.file_op({"op": "listdir", "path": str(tmp_path)})["out"] == "a\nl"
    missing = agent.file_op({"op": "read", "path": str(tmp_path / "none")})
    assert missing["rc"] == 2 and "No such file" in missing["err"]
    assert agent.file_op({"op": "format-disk", "path": target})["rc"] == 22


def test_probe_pattern_names_sequence_and_offset() -> None:
    probe = load("ioprobe")
    a, b = probe.pattern(1, 4096), probe.pattern(2, 4096)
    assert len(a) == 4096 and a != b and b"seq=0000000000000001" in a


def test_ana_state_is_checked_before_touching_the_guest() -> None:
    fabric = Fabric(vm=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ANA state"):
        fabric.set_ana(1, "mostly-optimized")


def test_a_guest_kernel_crash_at_boot_is_booted_once_more_and_a_second_one_raised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lab.vm import BootCrash, LabError, LabVM

    vm = LabVM.__new__(LabVM)  # no QEMU: only start()'s retry policy is under test
    outcomes: list[Exception | None] = [BootCrash("Oops: int3"), None]

    def boot() -> LabVM:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return vm

    vm._boot = boot  # type: ignore[method-assign]
    assert vm.start() is vm and outcomes == []
    assert "booting it once more" in capsys.readouterr().err
    outcomes[:] = [BootCrash("first"), BootCrash("second")]
    with pytest.raises(BootCrash, match="second"):
        vm.start()
    outcomes[:] = [LabError("timeout 300s")]  # not a crash: no second boot
    with pytest.raises(LabError, match="timeout"):
        vm.start()
