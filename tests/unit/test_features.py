"""What each StorageClass feature needs of a node (``initiator/features.py``): found where it is, a gap with the
exact fix where it is not; a stage that asks for a missing feature is refused before anything connects, and the
node's storage health keeps reporting it; doctor fails only for the features required of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.initiator.doctor import check_features
from nvmeof_csi.initiator.features import FEATURES, NodeFeatures, features_of
from nvmeof_csi.nvmeof.context import VolumeContext
from tests.unit.test_connector import ME, VOL, connector, ctx

RELEASE = "6.12.0-test"


def roots(
    tmp: Path, loaded: tuple[str, ...] = (), installed: tuple[str, ...] = (), multipath: str = "Y"
) -> NodeFeatures:
    sys_root, modules, cgroups = tmp / "sys", tmp / "modules", tmp / "cg"
    for name in loaded:
        (sys_root / "module" / name).mkdir(parents=True)
    (sys_root / "module" / "nvme_core" / "parameters").mkdir(parents=True, exist_ok=True)
    (sys_root / "module" / "nvme_core" / "parameters" / "multipath").write_text(multipath + "\n")
    (modules / RELEASE).mkdir(parents=True)
    (modules / RELEASE / "modules.dep").write_text(
        "".join(f"kernel/drivers/nvme/host/{m}.ko.xz: kernel/drivers/nvme/host/nvme-core.ko.xz\n" for m in installed)
    )
    cgroups.mkdir()
    (cgroups / "cgroup.controllers").write_text("cpu io memory\n")
    return NodeFeatures(sys_root, modules, cgroups, authenticates=lambda: False, release=lambda: RELEASE)


def test_a_volume_asks_for_its_transport_its_paths_its_auth_and_its_limits() -> None:
    plain = VolumeContext.from_dict(ctx(VOL, portals="tcp:127.0.0.1:4420"))
    assert features_of(plain) == {"tcp"}
    rich = VolumeContext.from_dict(
        ctx(VOL, portals="rdma:10.0.0.1:4420,rdma:10.0.0.2:4420", auth="dhchap", readIops="100")
    )
    assert features_of(rich) == {"rdma", "multipath", "dhchap", "qos"}
    assert features_of(VolumeContext.from_dict(ctx(VOL, portals="tcp:127.0.0.1:4430", tls="psk"))) == {"tcp", "tls"}


def test_tls_needs_the_kernel_option_and_a_running_tlshd(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    (sys_root / "module").mkdir(parents=True)
    capable = NodeFeatures(sys_root, tls_capable=lambda: True, handshake_daemon=lambda: False, release=lambda: RELEASE)
    gap = capable.gap("tls")
    assert gap is not None and "tlshd" in gap.why and "nvmeTls.handshakeDaemon" in gap.fix
    ready = NodeFeatures(sys_root, tls_capable=lambda: True, handshake_daemon=lambda: True, release=lambda: RELEASE)
    assert ready.gap("tls") is None


def test_each_gap_names_its_fix(tmp_path: Path) -> None:
    node = roots(tmp_path, loaded=("nvme_tcp",), installed=("nvme-rdma",), multipath="N")
    assert node.gap("tcp") is None  # loaded
    rdma = node.gap("rdma")  # installed (the kernel loads it at connect), but no RDMA device
    assert rdma is not None and "no RDMA device" in rdma.why and "rdma_rxe" in rdma.fix
    multipath = node.gap("multipath")
    assert multipath is not None and "nvme_core.multipath=Y" in multipath.fix
    dhchap = node.gap("dhchap")
    assert dhchap is not None and "CONFIG_NVME_HOST_AUTH" in dhchap.why
    assert node.gap("qos") is None
    tls = node.gap("tls")
    assert tls is not None and "CONFIG_NVME_TCP_TLS" in tls.why
    assert node.gap("nvme-over-carrier-pigeon") is not None
    bare = roots(tmp_path / "bare")
    tcp = bare.gap("tcp")
    assert tcp is not None and "modprobe nvme-tcp" in tcp.fix and "/etc/modules-load.d/" in tcp.fix


def test_a_stage_that_asks_for_a_missing_feature_is_refused_before_any_connect(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path / "node")
    (tmp_path / "node" / "class" / "nvme-fabrics").mkdir(parents=True)  # the fabrics layer is there
    conn._features = roots(tmp_path / "f", loaded=("nvme_tcp",))  # the node has TCP, no RDMA module
    wanted = ctx(VOL, portals="rdma:10.0.0.1:4420,rdma:10.0.0.2:4420")
    with pytest.raises(FailedPrecondition, match="nvme-rdma module") as refused:
        conn.connect(VOL, wanted, 5)
    assert "modprobe nvme-rdma" in str(refused.value)
    assert fake.connects == []  # nothing was written to /dev/nvme-fabrics
    gaps = conn.health().gaps
    assert len(gaps) == 1 and gaps[0].startswith("rdma:")  # reported until the node has it
    assert conn.health().ready and ME.nqn in conn.health().message


def test_doctor_fails_only_for_required_features(tmp_path: Path) -> None:
    node = roots(tmp_path, loaded=("nvme_tcp",))
    checks = {c.name: c for c in check_features(node, required=["tcp", "dhchap"])}
    assert set(checks) == {f"feature {f}" for f in FEATURES}
    assert checks["feature tcp"].ok and not checks["feature tcp"].absent
    assert not checks["feature dhchap"].ok and checks["feature dhchap"].fix
    assert checks["feature rdma"].ok and checks["feature rdma"].absent  # missing, but nothing asks for it
