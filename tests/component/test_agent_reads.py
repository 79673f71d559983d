"""The agent's read RPCs (GetVolume by UUID and by name, LookupName, ListVolumes) write nothing: they answer from
a state folder that the process cannot write to. Root runs the reader with the capabilities that bypass file
modes dropped from its bounding set (``setpriv``), so the folder's modes hold for it too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvmeof_csi.agent.names import Reservation
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from tests.support.agents import make_agent

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
UNRESERVED = "6c4f2a10-3b1e-4c7d-9e8f-0a1b2c3d4e01"
NO_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner,-linux_immutable"]

READER = """
import json, sys
from pathlib import Path
from nvmeof_csi.agent.api import AgentServicer
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from tests.support.agents import make_agent

tmp = Path(sys.argv[1])
try:
    (tmp / "state" / "probe").write_text("x")
    sys.exit("the state folder is writable: this test could not fail")
except PermissionError:
    pass
api = AgentServicer(make_agent(tmp), [])
by_uuid = api.GetVolume(pb.GetVolumeRequest(uuid=sys.argv[2]), None)
by_name = api.GetVolume(pb.GetVolumeRequest(name="pvc-ro"), None)
kept = api.LookupName(pb.LookupNameRequest(name="pvc-reserved"), None)
used = api.LookupName(pb.LookupNameRequest(name="pvc-ro"), None)
listed = api.ListVolumes(pb.ListVolumesRequest(), None)
print(json.dumps([by_uuid.uuid, by_name.uuid, kept.volume_uuid, kept.agent, used.volume_uuid,
                  [v.uuid for v in listed.volumes]]))
"""


def _read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o400)


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
def test_get_volume_lookup_and_list_answer_from_a_read_only_state_folder(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.converge()
    vol = agent.create_volume("pvc-ro", 8 * MiB, VolumeParameters.parse({}), {}).record
    agent.reserve_name(Reservation("pvc-reserved", UNRESERVED, "store-b"))
    _read_only(tmp_path / "state")
    before = {p: p.stat().st_mtime_ns for p in [tmp_path / "state", *(tmp_path / "state").rglob("*")]}
    prefix = NO_OVERRIDE if os.geteuid() == 0 else []
    try:
        out = subprocess.run(
            [*prefix, sys.executable, "-c", READER, str(tmp_path), vol.uuid],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        for path in [tmp_path / "state", *(tmp_path / "state").rglob("*")]:
            path.chmod(0o700 if path.is_dir() else 0o600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == [vol.uuid, vol.uuid, UNRESERVED, "store-b", vol.uuid, [vol.uuid]]
    assert {p: p.stat().st_mtime_ns for p in before} == before
