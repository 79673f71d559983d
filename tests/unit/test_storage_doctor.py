"""``nvmeofctl storage doctor`` (``cli/storage_doctor.py``) on a made-up storage node: a node ready for replicated
volumes passes; each missing part (DRBD, drbd-utils, the agent's helper, a controller-ID window of its own)
fails its check with the fix; the command exits 1 naming what failed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from typer.testing import CliRunner

from nvmeof_csi.cli.main import app
from nvmeof_csi.cli.storage_doctor import AGENT_HELPER, StorageRoots, diagnose_storage
from nvmeof_csi.errors import CommandError
from nvmeof_csi.host.executor import Result

PROC = "version: 8.4.11 (api:1/proto:86-101)\nsrcversion: 0123456789ABCDEF\n"


class Modinfo:
    def __init__(self, version: str = "") -> None:
        self.version, self.calls = version, 0

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True, stdin: str | None = None,
            secrets: Sequence[str] = ()) -> Result:  # fmt: skip
        self.calls += 1
        if not self.version:
            raise CommandError(list(argv), 1, "", "modinfo: ERROR: Module drbd not found.")
        return Result(0, f"{self.version}\n", "")


def storage_node(tmp: Path, proc: str = PROC, helper: str = AGENT_HELPER, window: tuple[int, int] = (1000, 1999),
                 tools: Sequence[str] = ("drbdadm-84", "drbdsetup-84", "drbdmeta-84")) -> StorageRoots:  # fmt: skip
    roots = StorageRoots(tmp / "proc", tmp / "sys", tmp / "configfs", tmp / "tools")
    for folder in (roots.proc, roots.tools):
        folder.mkdir(parents=True)
    if proc:
        (roots.proc / "drbd").write_text(proc)
        params = roots.sys / "module" / "drbd" / "parameters"
        params.mkdir(parents=True)
        (params / "usermode_helper").write_text(f"{helper}\n")
    for name in tools:
        (roots.tools / name).write_text("#!/bin/sh\n")
        (roots.tools / name).chmod(0o755)
    for nqn, device in (("nqn.r", "/dev/drbd100"), ("nqn.single", "/srv/pool/v.img")):
        sub = roots.configfs / "nvmet" / "subsystems" / nqn
        (sub / "namespaces" / "1").mkdir(parents=True)
        (sub / "namespaces" / "1" / "device_path").write_text(f"{device}\n")
        (sub / "attr_cntlid_min").write_text(f"{window[0]}\n")
        (sub / "attr_cntlid_max").write_text(f"{window[1]}\n")
    return roots


def results(roots: StorageRoots, executor: Modinfo | None = None) -> dict[str, tuple[bool, str, str]]:
    return {c.name: (c.ok, c.detail, c.fix) for c in diagnose_storage(executor or Modinfo(), roots)}


def test_a_storage_node_ready_for_replicated_volumes_passes_every_check(tmp_path: Path) -> None:
    seen = results(storage_node(tmp_path))
    assert all(ok for ok, _, _ in seen.values()), seen
    assert seen["DRBD module"][1] == "DRBD 8.4.11, loaded"
    assert seen["cntlid window"][1] == "replicated subsystems' windows: 1000-1999"


def test_each_missing_part_fails_its_check_with_the_fix(tmp_path: Path) -> None:
    drbd9 = results(storage_node(tmp_path / "a", proc="version: 9.2.8 (api:2/proto:86-122)\n"))
    assert drbd9["DRBD module"][:2] == (False, "DRBD 9.2.8 (loaded)") and "in-tree DRBD 8.4" in drbd9["DRBD module"][2]
    unloaded = Modinfo("8.4.11")
    loadable = results(storage_node(tmp_path / "b", proc=""), unloaded)
    assert loadable["DRBD module"][:2] == (True, "DRBD 8.4.11, not loaded (the agent loads it)") and unloaded.calls
    assert loadable["fence-peer helper"][0]  # absent, not failed: the agent sets it when it loads DRBD
    assert not results(storage_node(tmp_path / "c", proc=""))["DRBD module"][0]  # no module at all
    tools = results(storage_node(tmp_path / "d", tools=("drbdadm-84",)))["drbd-utils"]
    assert tools[:1] == (False,) and "drbdsetup-84, drbdmeta-84" in tools[1] and tools[2] == "apt install drbd-utils"
    helper = results(storage_node(tmp_path / "e", helper="/sbin/drbdadm"))["fence-peer helper"]
    assert helper[:2] == (False, f"DRBD's usermode helper is '/sbin/drbdadm', not the agent's {AGENT_HELPER}")
    window = results(storage_node(tmp_path / "f", window=(1, 65519)))["cntlid window"]
    assert window[:2] == (False, "1 replicated subsystem(s) with nvmet's own window 1-65519, e.g. nqn.r")
    assert "--cntlid-window" in window[2]


def test_storage_doctor_command_exits_1_and_lists_the_failed_checks(tmp_path: Path) -> None:
    storage_node(tmp_path / "root", helper="/sbin/drbdadm")
    root = tmp_path / "root"
    for made, real in (("proc", "proc"), ("configfs", "sys/kernel/config"), ("tools", "usr/lib/drbd")):
        (root / real).parent.mkdir(parents=True, exist_ok=True)
        if made != real:
            (root / made).rename(root / real)
    out = CliRunner().invoke(app, ["-o", "json", "storage", "doctor", "--root", str(root)])
    assert out.exit_code == 1, out.output
    assert {r["name"]: r["result"] for r in json.loads(out.stdout)} == {
        "DRBD module": "pass", "drbd-utils": "pass", "fence-peer helper": "FAIL", "cntlid window": "pass",
    }  # fmt: skip
    assert "1 check(s) failed: fence-peer helper" in out.stderr
