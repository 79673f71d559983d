"""Lab pieces that need no VM: the guest agent's command runner and file operations (run here on the host),
the probe's pattern, and the fabric helpers' argument checks."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

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


def test_the_probe_check_finds_the_last_acknowledged_write_of_every_block_and_a_lost_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = load("ioprobe")
    device, blocks, acked = tmp_path / "dev", 8, 21  # writes 0..20 over 8 blocks: 16..20 last in blocks 0..4
    content = [probe.pattern(seq, (seq % blocks) * 4096) for seq in range(acked)]
    last = {seq % blocks: block for seq, block in enumerate(content)}
    device.write_bytes(b"".join(last[b] for b in range(blocks)))
    args = ["ioprobe", str(device), "0", "--mode", "check", "--acked", str(acked), "--blocks", str(blocks)]

    def run() -> dict[str, object]:
        sys.argv = args
        probe.main()
        return dict(json.loads(capsys.readouterr().out))

    assert run()["verify_errors"] == 0
    with device.open("r+b") as f:  # block 3 lost its last write (seq 19): it holds seq 11 instead
        f.seek(3 * 4096)
        f.write(content[11])
    found = run()
    assert found["verify_errors"] == 1 and "want seq 19" in str(found["errlog"])


def test_a_probe_asked_to_stop_ends_only_after_its_io_has_flowed_for_its_tail(tmp_path: Path) -> None:
    stop = load("ioprobe").Stop(str(tmp_path / "stop"), 3.0, 100.0)
    assert not stop.due(101.0, resumed=100.0)  # not asked
    (tmp_path / "stop").touch()
    assert not stop.due(101.1, resumed=100.0)  # looked for at most every 0.2 s
    assert not stop.due(101.3, resumed=100.0)  # seen now
    assert not stop.due(104.0, resumed=103.5)  # a stall ended 0.5 s ago: the resumed I/O must be seen too
    assert not stop.due(106.4, resumed=103.5)
    assert stop.due(106.6, resumed=103.5)


def test_ana_state_is_checked_before_touching_the_guest() -> None:
    fabric = Fabric(vm=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ANA state"):
        fabric.set_ana(1, "mostly-optimized")


def test_a_guest_crash_or_hang_at_boot_is_booted_once_more_and_a_second_one_raised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lab.vm import BootCrash, BootHang, LabError, LabVM

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
    outcomes[:] = [BootHang("timeout 300s"), None]  # a silent hang: booted once more
    assert vm.start() is vm and outcomes == []
    assert "hung while booting; booting it once more" in capsys.readouterr().err
    outcomes[:] = [BootHang("first hang"), BootHang("second hang")]
    with pytest.raises(BootHang, match="second hang"):
        vm.start()
    outcomes[:] = [LabError("qemu control socket never appeared")]  # neither: no second boot
    with pytest.raises(LabError, match="socket"):
        vm.start()


def test_a_vm_that_exits_is_raised_with_its_console_not_a_broken_pipe(tmp_path: Path) -> None:
    from lab.vm import LabError, LabVM, VMExited

    vm = LabVM.__new__(LabVM)  # no QEMU: a process that has exited and a connection whose far end closed
    vm.rundir = tmp_path
    (tmp_path / "console.log").write_text("Kernel panic - not syncing: Attempted to kill init!\n")
    vm.proc = subprocess.Popen(["true"])
    vm.proc.wait()
    ours, theirs = socket.socketpair()
    theirs.close()
    vm._sock = ours
    vm._ids = iter(range(1, 10))  # type: ignore[assignment]
    vm._pending, vm._lock = {}, threading.Lock()
    assert not vm.alive()
    with pytest.raises(VMExited, match="Attempted to kill init"):
        vm.ensure_alive("waiting for the Node")
    with pytest.raises(VMExited, match="qemu rc=0"):
        for _ in range(3):  # the first send may still land in the socket's buffer
            vm.run(["true"])
    assert issubclass(VMExited, LabError)
    ours.close()


def test_the_cluster_replaces_a_vm_that_exits_during_bring_up_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lab.kube import cluster
    from lab.vm import VMExited

    events: list[str] = []

    class FakeLab:
        def __init__(self, *_: object, **__: object) -> None:
            events.append("vm")

        def close(self) -> None:
            events.append("close")

    class FakeCP:
        def __init__(self, *_: object) -> None:
            self.rundir = Path("/nowhere")

        api_port = 0

        def start(self) -> None:
            events.append("cp")

        def stop(self) -> None:
            events.append("cp-stop")

        def kubectl(self, *args: str, **_: object) -> str:
            events.append(" ".join(args[:2]))
            return ""

    outcomes: list[Exception | None] = [VMExited("Oops: int3 in sched_clock_cpu"), None]
    sentinel: Any = SimpleNamespace()  # the cluster bring_up made

    def bring_up(
        cp: object, vm: object, images: object, tag: str, disk_key: str, helm_args: object, slim: object
    ) -> object:
        assert disk_key == "k"
        events.append("bring-up")
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return sentinel

    monkeypatch.setattr(
        cluster,
        "current_image",
        lambda: {
            "tag": "t",
            "tar": "/x.tar",
            "base_ref": "localhost/nvmeof-csi-base:b",
            "base_tar": "/b.tar",
            "slim_tar": "/s.tar",
        },
    )
    monkeypatch.setattr(cluster, "build_images", lambda: {})
    monkeypatch.setattr(cluster, "ControlPlane", FakeCP)
    monkeypatch.setattr(cluster, "LabCluster", FakeLab)
    monkeypatch.setattr(cluster, "qemu_netdev", lambda port, forwards: [])
    monkeypatch.setattr(cluster, "bring_up", bring_up)
    monkeypatch.setattr("lab.kube.scratch_cache.key", lambda images, gb: "k")
    monkeypatch.setattr("lab.kube.scratch_cache.cached", lambda key: None)
    with cluster.running_cluster() as up:
        assert up is sentinel
    deletes = ["delete node"] * 3  # every node of the first lab
    assert events == ["cp", "vm", "bring-up", "close", *deletes, "vm", "bring-up", "close", "cp-stop"]
    assert "starting fresh ones" in capsys.readouterr().err
    events.clear()
    outcomes[:] = [VMExited("first"), VMExited("second")]
    with pytest.raises(VMExited, match="second"), cluster.running_cluster():
        pass
    assert events.count("bring-up") == 2 and events[-1] == "cp-stop"


def test_the_machine_cache_has_one_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from image import machine_cache as mc

    monkeypatch.setenv("NVMEOF_CSI_CACHE", str(tmp_path))
    assert mc.machine_cache() == tmp_path
    monkeypatch.delenv("NVMEOF_CSI_CACHE")
    monkeypatch.setattr("image.machine_cache.os.geteuid", lambda: 0)
    assert mc.machine_cache() == Path("/var/cache/nvmeof-csi")
    monkeypatch.setattr("image.machine_cache.os.geteuid", lambda: 1000)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mc.machine_cache() == tmp_path / "home" / ".cache" / "nvmeof-csi"


def test_a_fenced_writer_ends_its_after_seconds_past_the_marker_not_its_whole_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scribble, device, marker = load("scribble"), tmp_path / "dev", tmp_path / "fenced"
    device.write_bytes(bytes(64 * 4096))
    marker.touch()  # the fence has returned before the writer starts
    argv = ["scribble", "write", str(device), "3600", "gpu-1", "--marker", str(marker), "--after", "0.2"]
    monkeypatch.setattr(sys, "argv", argv)
    scribble.main()  # without --after this would write for an hour
    out = json.loads(capsys.readouterr().out)
    assert out["fenced_seen"] == 1 and out["direct_after"] == out["direct_ok"] > 0, out
