"""The host-side sysfs model against a tree laid out like kernel 6.1's (as seen in the lab VM)."""

from __future__ import annotations

import json
from pathlib import Path

from nvmeof_csi.initiator.identity import HostIdentity, ensure_identity
from nvmeof_csi.initiator.sysfs import NvmeSysfs, parse_address
from nvmeof_csi.nvmeof.nqn import UUID_NQN_PREFIX

UUID_A = "fc50ed74-91c7-4f2f-9ccc-e1e5ce41b835"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_sys(root: Path, subsys: int, nqn: str, ctrls: dict[int, tuple[str, str, str]], ns_uuid: str) -> None:
    """A subsystem ``nvme-subsys<subsys>`` with controllers {instance: (state, address, ana)} and namespace 1."""
    sub = root / "class" / "nvme-subsystem" / f"nvme-subsys{subsys}"
    write(sub / "subsysnqn", nqn)
    (sub / f"nvme{subsys}n1").mkdir(parents=True)
    write(root / "block" / f"nvme{subsys}n1" / "uuid", ns_uuid)
    write(root / "block" / f"nvme{subsys}n1" / "nsid", "1")
    write(root / "block" / f"nvme{subsys}n1" / "size", "131072")
    for inst, (state, address, ana) in ctrls.items():
        (sub / f"nvme{inst}").mkdir()
        ctrl = root / "class" / "nvme" / f"nvme{inst}"
        write(ctrl / "state", state)
        write(ctrl / "transport", "tcp")
        write(ctrl / "address", address)
        write(ctrl / "hostnqn", UUID_NQN_PREFIX + "h")
        write(root / "block" / f"nvme{subsys}c{inst}n1" / "ana_state", ana)


def test_subsystems_paths_and_namespace_by_uuid(tmp_path: Path) -> None:
    fake_sys(
        tmp_path,
        0,
        "nqn.x:vol10",
        {0: ("live", "traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1", "optimized")},
        "11111111-0000-0000-0000-000000000000",
    )
    fake_sys(
        tmp_path,
        1,
        "nqn.x:vol1",
        {
            1: ("live", "traddr=127.0.0.1,trsvcid=4420", "optimized"),
            2: ("connecting", "traddr=127.0.0.2,trsvcid=4421", "inaccessible"),
        },
        UUID_A,
    )
    write(tmp_path / "module" / "nvme_core" / "parameters" / "multipath", "Y")
    sysfs = NvmeSysfs(tmp_path)
    assert sysfs.multipath_enabled() is True
    sub = sysfs.subsystem("nqn.x:vol1")
    assert sub is not None and sub.name == "nvme-subsys1"  # whole-NQN match: not vol10
    assert [c.portal for c in sub.controllers] == ["tcp:127.0.0.1:4420", "tcp:127.0.0.2:4421"]
    assert [c.name for c in sub.live()] == ["nvme1"]
    ns = sysfs.find_namespace(UUID_A.upper())
    assert ns is not None and ns.device == "/dev/nvme1n1" and ns.size_bytes == 64 << 20
    assert [(p.controller, p.ana_state) for p in ns.paths] == [("nvme1", "optimized"), ("nvme2", "inaccessible")]
    assert sysfs.find_namespace("22222222-0000-0000-0000-000000000000") is None


def test_vanished_controller_is_absent_and_no_nvme_is_none(tmp_path: Path) -> None:
    fake_sys(tmp_path, 0, "nqn.x:a", {0: ("live", "traddr=1.2.3.4,trsvcid=4420", "optimized")}, UUID_A)
    (tmp_path / "class" / "nvme" / "nvme0" / "state").unlink()  # being deleted
    sub = NvmeSysfs(tmp_path).subsystem("nqn.x:a")
    assert sub is not None and sub.controllers == ()
    assert NvmeSysfs(tmp_path / "empty").subsystems() == []
    assert NvmeSysfs(tmp_path / "empty").multipath_enabled() is None


def test_parse_address() -> None:
    assert parse_address("traddr=169.254.77.1,trsvcid=4420") == {"traddr": "169.254.77.1", "trsvcid": "4420"}


def test_identity_generated_for_all_zero_and_then_kept(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    write(etc / "hostnqn", UUID_NQN_PREFIX + "00000000-0000-0000-0000-000000000000")
    write(etc / "hostid", "00000000-0000-0000-0000-000000000000")
    first, origin = ensure_identity(tmp_path / "state", etc)
    assert origin == "generated" and first.valid()
    assert (etc / "hostnqn").read_text().strip() == first.nqn and (etc / "hostid").read_text().strip() == first.host_id
    write(etc / "hostnqn", "nqn.2014-08.org.nvmexpress:uuid:clobbered-by-an-image-update")
    again, origin = ensure_identity(tmp_path / "state", etc)
    assert again == first and origin == "saved" and (etc / "hostnqn").read_text().strip() == first.nqn


def test_identity_adopts_a_valid_pair(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    write(etc / "hostnqn", UUID_NQN_PREFIX + UUID_A)
    write(etc / "hostid", UUID_A)
    found, origin = ensure_identity(tmp_path / "state", etc)
    assert origin == "adopted" and found == HostIdentity(UUID_NQN_PREFIX + UUID_A, UUID_A)
    assert not HostIdentity(UUID_NQN_PREFIX + UUID_A, "11111111-0000-0000-0000-000000000000").valid()  # mismatched pair


def test_identity_made_on_another_machine_is_replaced(tmp_path: Path) -> None:
    """A cloned disk or state folder would give two nodes one host NQN: the copy is bound to the machine ID."""
    etc, state, mid = tmp_path / "etc", tmp_path / "state", tmp_path / "machine-id"
    write(mid, "0f0e0d0c0b0a09080706050403020100")
    first, origin = ensure_identity(state, etc, mid)
    assert origin == "generated"
    assert ensure_identity(state, etc, mid) == (first, "saved")
    write(mid, "ffeeddccbbaa99887766554433221100")  # the same state on another machine
    clone, origin = ensure_identity(state, etc, mid)
    assert origin == "regenerated" and clone != first and clone.valid()
    assert (etc / "hostnqn").read_text().strip() == clone.nqn
    assert ensure_identity(state, etc, mid) == (clone, "saved")
    old = tmp_path / "old"  # a copy saved before the binding existed is kept, and bound from now on
    write(old / "host-identity.json", json.dumps({"nqn": first.nqn, "host_id": first.host_id}))
    assert ensure_identity(old, etc, mid) == (first, "saved")
    assert json.loads((old / "host-identity.json").read_text())["machine"]
    assert ensure_identity(old, etc, tmp_path / "no-machine-id") == (first, "saved")  # no ID: no binding


def test_an_nqn_is_read_once_per_subsystem_and_a_new_subsystem_under_the_same_name_afresh(tmp_path: Path) -> None:
    fake_sys(tmp_path, 1, "nqn.x:a", {1: ("live", "traddr=127.0.0.1,trsvcid=4420", "optimized")}, UUID_A)
    sysfs = NvmeSysfs(tmp_path)
    assert sysfs.subsystem("nqn.x:a") is not None
    folder = tmp_path / "class" / "nvme-subsystem"
    # the kernel never rewrites an NQN in place; doing it here shows the first read is what is remembered
    write(folder / "nvme-subsys1" / "subsysnqn", "nqn.x:rewritten")
    assert sysfs.subsystem("nqn.x:a") is not None and sysfs.subsystem("nqn.x:rewritten") is None
    # a subsystem removed and another made under the same name is a new folder entry (a new inode): read afresh
    fresh = folder / "nvme-subsys1.next"
    write(fresh / "subsysnqn", "nqn.x:b")
    (fresh / "nvme1").mkdir()
    (folder / "nvme-subsys1" / "subsysnqn").unlink()
    for child in (folder / "nvme-subsys1").iterdir():
        child.rmdir()
    (folder / "nvme-subsys1").rmdir()
    fresh.rename(folder / "nvme-subsys1")
    assert sysfs.subsystem("nqn.x:a") is None
    sub = sysfs.subsystem("nqn.x:b")
    assert sub is not None and [c.name for c in sub.controllers] == ["nvme1"]
    assert [s.nqn for s in sysfs.subsystems()] == ["nqn.x:b"]


def test_a_namespace_is_found_only_through_the_subsystem_that_lists_its_head(tmp_path: Path) -> None:
    fake_sys(tmp_path, 3, "nqn.x:a", {4: ("live", "traddr=127.0.0.1,trsvcid=4420", "optimized")}, UUID_A)
    sysfs = NvmeSysfs(tmp_path)
    ns = sysfs.find_namespace(UUID_A)
    assert ns is not None and ns.device == "/dev/nvme3n1" and [p.controller for p in ns.paths] == ["nvme4"]
    (tmp_path / "class" / "nvme-subsystem" / "nvme-subsys3" / "nvme3n1").rmdir()  # the head is going away
    assert sysfs.find_namespace(UUID_A) is None
    write(tmp_path / "block" / "nvme3c4n1" / "uuid", UUID_A)  # a path device is never taken for a head
    assert sysfs.find_namespace(UUID_A) is None
