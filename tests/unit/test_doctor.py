"""nvmeofctl doctor's checks against a node tree in a folder (the lab tier runs it on a real kernel), and
trace's volume argument parsing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import pytest
from typer.testing import CliRunner

from nvmeof_csi.cli.context import parse_volume
from nvmeof_csi.cli.main import app
from nvmeof_csi.errors import CommandError, InvalidArgument
from nvmeof_csi.host.executor import Result
from nvmeof_csi.initiator.doctor import diagnose

HOST_ID = "6f1c1a8e-2b7d-4c3e-9f00-1234567890ab"
NQN = f"nqn.2014-08.org.nvmexpress:uuid:{HOST_ID}"


class NvmeVersion:
    def __init__(self, out: str = "nvme version 2.3 (git 2.3)\nlibnvme version 1.3\n", fail: bool = False) -> None:
        self.out, self.fail = out, fail

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        check: bool = True,
        stdin: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Result:
        if self.fail:
            raise CommandError(list(argv), 127, "", "nvme: command not found")
        return Result(0, self.out, "")


class Roots(TypedDict):
    sys_root: Path
    etc_dir: Path
    cgroup_root: Path


def node(
    tmp: Path,
    multipath: str = "Y",
    modules: Sequence[str] = ("nvme_core", "nvme_fabrics", "nvme_tcp"),
    nqn: str = NQN,
    host_id: str = HOST_ID,
    io: bool = True,
    rdma: Sequence[str] = (),
) -> Roots:
    sys_root, etc, cg = tmp / "sys", tmp / "etc", tmp / "cg"
    for module in modules:
        (sys_root / "module" / module).mkdir(parents=True)
    if "nvme_core" in modules:
        (sys_root / "module" / "nvme_core" / "parameters").mkdir()
        (sys_root / "module" / "nvme_core" / "parameters" / "multipath").write_text(multipath + "\n")
    for device in rdma:
        (sys_root / "class" / "infiniband" / device).mkdir(parents=True)
    etc.mkdir()
    if nqn:
        (etc / "hostnqn").write_text(nqn + "\n")
    if host_id:
        (etc / "hostid").write_text(host_id + "\n")
    cg.mkdir()
    (cg / "cgroup.controllers").write_text("cpu io memory\n" if io else "cpu memory\n")
    return {"sys_root": sys_root, "etc_dir": etc, "cgroup_root": cg}


def failed(checks: Sequence[object]) -> list[str]:
    return [c.name for c in checks if not c.ok]  # type: ignore[attr-defined]


def test_a_ready_node_passes_every_check(tmp_path: Path) -> None:
    checks = diagnose(NvmeVersion(), **node(tmp_path))
    assert failed(checks) == []
    assert [c.name for c in checks] == [
        "modules",
        "native multipath",
        "host identity",
        "nvme-cli",
        "RDMA devices",
        "cgroup v2 io controller",
    ]


@pytest.mark.parametrize(
    ("change", "name", "words"),
    [
        ({"multipath": "N"}, "native multipath", "multipath=N"),
        ({"modules": ("nvme_core", "nvme_fabrics")}, "modules", "nvme_tcp"),
        (
            {
                "host_id": "00000000-0000-0000-0000-000000000000",
                "nqn": "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000",
            },
            "host identity",
            "all-zero",
        ),
        ({"nqn": ""}, "host identity", "missing"),
        ({"host_id": "0b0e2c1d-9a8b-4c7d-8e6f-5a4b3c2d1e0f"}, "host identity", "disagree"),
        ({"io": False}, "cgroup v2 io controller", "io controller"),
        ({"rdma": ("rxe0",)}, "modules", "nvme_rdma"),  # an RDMA node needs nvme-rdma too
    ],
)
def test_each_broken_part_fails_its_check_with_a_fix(
    tmp_path: Path, change: dict[str, object], name: str, words: str
) -> None:
    checks = diagnose(NvmeVersion(), **node(tmp_path, **change))  # type: ignore[arg-type]
    assert failed(checks) == [name]
    bad = next(c for c in checks if c.name == name)
    assert words in bad.detail and bad.fix


def test_shared_identity_and_old_or_missing_nvme_cli(tmp_path: Path) -> None:
    roots = node(tmp_path)
    checks = diagnose(NvmeVersion(), **roots, peers=["nqn.2014-08.org.nvmexpress:uuid:other", NQN.upper()])
    assert failed(checks) == ["identity unique"]
    assert failed(diagnose(NvmeVersion(), **roots, peers=["nqn.other"])) == []
    assert failed(diagnose(NvmeVersion("nvme version 1.16\n"), **roots)) == ["nvme-cli"]
    assert failed(diagnose(NvmeVersion(fail=True), **roots)) == ["nvme-cli"]
    assert failed(diagnose(NvmeVersion(), **roots, require_rdma=True)) == ["RDMA devices"]


def test_doctor_command_exits_1_and_lists_failures(tmp_path: Path) -> None:
    roots = node(tmp_path, multipath="N")
    args = [
        "-o",
        "json",
        "doctor",
        "--sys-root",
        str(roots["sys_root"]),
        "--etc-nvme",
        str(roots["etc_dir"]),
        "--cgroup-root",
        str(roots["cgroup_root"]),
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 1
    rows = json.loads(out.stdout)
    assert {r["name"]: r["result"] for r in rows}["native multipath"] == "FAIL"


def test_trace_accepts_volume_ids_uuids_and_names() -> None:
    vol = "5b8e6a43-0c2d-4f1e-9a7b-3c4d5e6f7a8b"
    assert parse_volume(f"nvmeof-v1.store-a.{vol}") == ("store-a", vol, None)
    assert parse_volume(vol.upper()) == (None, vol, None)
    assert parse_volume("pvc-1234") == (None, None, "pvc-1234")
    with pytest.raises(InvalidArgument):
        parse_volume("nvmeof-v1.store-a.not-a-uuid")
