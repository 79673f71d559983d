"""The Kubernetes tier's own logic, without building or booting anything: pins, the VM's network isolation,
the node's generated configuration files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from lab.build import BuildInfo
from lab.kube import scratch_cache
from lab.kube.build import components, versions
from lab.kube.control_plane import GUEST_API, GUEST_API_PORT, SERVICE_IP, SERVICE_RANGE
from lab.kube.layout import MACHINES, routes
from lab.kube.node import KUBE_IP, cni_config, containerd_config, kubelet_config, qemu_netdev


def test_every_component_is_pinned_in_versions_env(tmp_path: Path) -> None:
    pins = versions()
    names = [c.name for c in components(pins)]
    assert len(names) == len(set(names))
    assert all(c.version.startswith("v") for c in components(pins))
    assert pins["KUBERNETES_BUILD_VERSION"].startswith("v1.37.")
    env = tmp_path / "v.env"
    env.write_text("A=1  # comment\n# B=2\nC=x\n")
    assert versions(env) == {"A": "1", "C": "x"}


def test_vm_network_reaches_only_the_api_server() -> None:
    args = qemu_netdev(41234, {"10.0.2.101:39999": 41235})
    netdev = args[args.index("-netdev") + 1]
    opts = netdev.split(",")
    assert "restrict=on" in opts
    forwards = [o for o in opts if o.startswith(("guestfwd=", "hostfwd="))]
    assert forwards == [
        f"guestfwd=tcp:{GUEST_API}:{GUEST_API_PORT}-cmd:socat - TCP:127.0.0.1:41234",
        "guestfwd=tcp:10.0.2.101:39999-cmd:socat - TCP:127.0.0.1:41235",
    ]


def test_service_ip_is_the_first_of_the_range_and_not_the_node() -> None:
    base = SERVICE_RANGE.split("/")[0].rsplit(".", 1)
    assert f"{base[0]}.{int(base[1]) + 1}" == SERVICE_IP
    assert KUBE_IP != SERVICE_IP != GUEST_API


def test_containerd_config_is_valid_toml_with_our_sandbox_and_cni() -> None:
    doc = tomllib.loads(containerd_config("/opt/cni", "localhost/pause:3.10"))
    images = doc["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "localhost/pause:3.10"
    runtime = doc["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cni"]["bin_dirs"] == ["/opt/cni"]
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert runtime["stats_collect_period"] == "30s"  # not every second: the shims' idle cost (containerd_config)


def test_cni_bridge_does_not_masquerade_and_uses_the_pod_range() -> None:
    conf = json.loads(cni_config("10.88.11.0/24"))
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.88.11.0/24"}]]


def test_nodes_have_their_own_addresses_pod_ranges_and_host_identities_and_route_to_each_other() -> None:
    for field in ("name", "node_ip", "pod_cidr", "host_id", "host_nqn"):
        values = [getattr(m, field) for m in MACHINES]
        assert len(set(values)) == len(values), (field, values)
    assert sum(m.storage for m in MACHINES) == 1 and any(m.rdma and not m.storage for m in MACHINES)
    for m in MACHINES:
        assert {cidr for cidr, _ in routes(m)} == {o.pod_cidr for o in MACHINES} - {m.pod_cidr}
        assert all(via.startswith("10.99.10.") and via != m.node_ip for _, via in routes(m))


def test_kubelet_config_refuses_anonymous_and_uses_cgroupfs() -> None:
    doc = yaml.safe_load(kubelet_config("/x/ca.crt"))
    assert doc["kind"] == "KubeletConfiguration"
    assert doc["authentication"]["anonymous"]["enabled"] is False
    assert doc["authentication"]["x509"]["clientCAFile"] == "/x/ca.crt"
    assert doc["cgroupDriver"] == "cgroupfs"


class FakeVM:
    """The two calls scratch_cache.save makes into the guest, recorded; ``freeze_rc`` is the freeze's exit code."""

    def __init__(self, scratch: Path, freeze_rc: int = 0) -> None:
        self.scratch, self.freeze_rc = scratch, freeze_rc
        self.calls: list[str] = []

    def run(self, argv: list[str], timeout: float) -> Any:
        self.calls.append(argv[-1])
        return SimpleNamespace(rc=self.freeze_rc, out="", err="fsfreeze: not supported" if self.freeze_rc else "")

    def check(self, argv: list[str], timeout: float) -> str:
        self.calls.append(" ".join(argv))
        return ""


def test_node_disk_key_follows_every_image_and_saving_replaces_the_older_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVMEOF_CSI_CACHE", str(tmp_path / "cache"))
    ctrd = tmp_path / "containerd"
    ctrd.write_bytes(b"bin")
    monkeypatch.setattr(scratch_cache, "binary", lambda name: ctrd)
    monkeypatch.setattr(BuildInfo, "load", classmethod(lambda cls: SimpleNamespace(inputs_sha256="k1")))
    tar = tmp_path / "a.tar"
    tar.write_bytes(b"one")
    first = scratch_cache.key({"localhost/a:1": tar}, 24)
    assert scratch_cache.key({"localhost/a:1": tar}, 24) == first and scratch_cache.cached(first) is None
    assert scratch_cache.key({"localhost/a:1": tar}, 8) != first
    disk = tmp_path / "scratch.img"
    disk.write_bytes(b"xfs with images")
    vm = FakeVM(disk)
    assert scratch_cache.save(vm, first) == scratch_cache.cached(first)  # type: ignore[arg-type]
    assert "fsfreeze --freeze /scratch" in vm.calls[0] and vm.calls[-1] == "fsfreeze --unfreeze /scratch"
    tar.write_bytes(b"two, a new image")
    second = scratch_cache.key({"localhost/a:1": tar}, 24)
    assert second != first
    scratch_cache.save(FakeVM(disk), second)  # type: ignore[arg-type]
    assert [p.name for p in (tmp_path / "cache" / "kube").iterdir()] == [f"scratch-{second}.img"]
    assert scratch_cache.save(FakeVM(disk, freeze_rc=1), "other") is None  # type: ignore[arg-type]
    assert scratch_cache.cached("other") is None


class CtrVM:
    """The node's ``ctr``: a listing of what containerd holds, and every import asked of it."""

    def __init__(self, held: set[str]) -> None:
        self.held = held
        self.imported: list[str] = []
        self.tars: list[str] = []  # the tar each import read

    def check(self, argv: list[str], timeout: float) -> str:
        if argv[-2:] == ["ls", "-q"]:
            return "\n".join(sorted(self.held))
        return ""

    def submit(self, argv: list[str], timeout: float) -> SimpleNamespace:
        ref = f"{argv[argv.index('--base-name') + 1]}:{Path(argv[-1]).stem}"
        self.imported.append(ref)
        self.tars.append(argv[-1])
        self.held.add(ref)
        return SimpleNamespace(check=lambda: "")


def test_the_node_imports_what_it_lacks_and_the_driver_image_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lab.kube import node as node_mod

    monkeypatch.setattr(node_mod, "binary", lambda name: tmp_path / name)
    images = {
        f"localhost/{name}:{tag}": tmp_path / f"{tag}.tar"
        for name, tag in (("pause", "p1"), ("workload", "w1"), ("nvmeof-csi", "0.1.0"))
    }
    vm = CtrVM({"localhost/pause:p1", "localhost/nvmeof-csi:0.1.0"})  # a saved disk with an older driver image
    machine = MACHINES[1]
    node = node_mod.KubeNode(vm, None, machine, images, always=["localhost/nvmeof-csi:0.1.0"])  # type: ignore[arg-type]
    assert node.import_images() == ["localhost/nvmeof-csi:0.1.0", "localhost/workload:w1"]
    assert sorted(vm.imported) == ["localhost/nvmeof-csi:0.1.0", "localhost/workload:w1"]
    assert node.import_images() == []  # a power-cycled node: its disk holds what this run imported
    without = node_mod.KubeNode(CtrVM(set(images)), None, machine, images)  # type: ignore[arg-type]
    assert without.import_images() == []


def test_the_driver_image_comes_from_its_slim_tar_only_where_the_base_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lab.kube import node as node_mod

    monkeypatch.setattr(node_mod, "binary", lambda name: tmp_path / name)
    driver, base = "localhost/nvmeof-csi:0.1.0", "localhost/nvmeof-csi-base:b1"
    images = {base: tmp_path / "b1.tar", driver: tmp_path / "0.1.0.tar"}
    slim = {driver: (base, tmp_path / "slim" / "0.1.0.tar")}
    with_base = CtrVM({base})
    node = node_mod.KubeNode(with_base, None, MACHINES[1], images, always=[driver], slim=slim)  # type: ignore[arg-type]
    assert node.import_images() == [driver]
    assert with_base.tars == [str(tmp_path / "slim" / "0.1.0.tar")]
    blank = CtrVM(set())  # the base comes in the same round: the driver's full tar
    node = node_mod.KubeNode(blank, None, MACHINES[1], images, always=[driver], slim=slim)  # type: ignore[arg-type]
    assert node.import_images() == [base, driver]
    assert sorted(blank.tars) == [str(tmp_path / "0.1.0.tar"), str(tmp_path / "b1.tar")]
