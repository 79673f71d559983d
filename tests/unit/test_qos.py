"""Per-pod I/O limits: parameter validation, pod cgroup lookup under both kubelet layouts, io.max lines written
at publish and removed at unpublish, health and the reconcile pass when a limit is not in force.

The kernel's io.max merges a written line into the device's entry and drops an all-``max`` entry; the
:class:`IoMaxTree` below keeps exactly that behaviour in files (the lab tier proves it on a real kernel)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvmeof_csi.csi.params import parse
from nvmeof_csi.errors import InvalidArgument
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.host.filesystems import Filesystems
from nvmeof_csi.host.mounter import Mounter
from nvmeof_csi.nvmeof.context import VolumeContext
from nvmeof_csi.nvmeof.qos import limits_from
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.service.qos import LimitOverrides, QosEnforcer
from nvmeof_csi.service.records import AccessSpec, StagingRecord, StagingStore
from nvmeof_csi.service.staging import StagingService
from tests.support.fakes import FakeConnector, FakeHost

POD = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
MOUNT = AccessSpec(block=False, fs_type="ext4")


class IoMaxTree(PodCgroups):
    """A cgroup v2 tree in a folder whose io.max files merge lines like the kernel's."""

    def __init__(self, root: Path, io: bool = True) -> None:
        super().__init__(root)
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n" if io else "cpu memory\n")

    def make_pod(self, relative: str) -> Path:
        folder = self.root / relative
        folder.mkdir(parents=True)
        (folder / "cgroup.procs").write_text("")
        (folder / "io.max").write_text("")
        return folder

    def set_io_max(self, cgroup: Path, line: str) -> None:
        device, *fields = line.split()
        lines = self.io_max(cgroup)
        merged = {
            **lines.get(device, {"riops": "max", "wiops": "max", "rbps": "max", "wbps": "max"}),
            **dict(f.split("=", 1) for f in fields),
        }
        lines[device] = merged
        if all(v == "max" for v in merged.values()):
            del lines[device]
        order = ("rbps", "wbps", "riops", "wiops")
        (cgroup / "io.max").write_text(
            "".join(f"{d} " + " ".join(f"{k}={v[k]}" for k in order) + "\n" for d, v in lines.items())
        )

    def clear_io_max(self, cgroup: Path, major_minor: str) -> None:
        if (cgroup / "io.max").exists():
            self.set_io_max(cgroup, f"{major_minor} riops=max wiops=max rbps=max wbps=max")


def test_limits_parse_units_unlimited_and_ranges() -> None:
    limits = limits_from({"readIops": "500", "writeIops": "max", "readBps": "0", "writeBps": "1048576", "x": "y"})
    assert limits.values == (("readIops", 500), ("writeBps", 1048576))
    assert limits.io_max_line("259:3") == "259:3 riops=500 wiops=max rbps=max wbps=1048576"
    for bad in ("-1", "1.5", "lots", str(1 << 50)):
        with pytest.raises(InvalidArgument, match="readIops"):
            limits_from({"readIops": bad})


def test_storageclass_accepts_limits_and_the_context_carries_them() -> None:
    parse({"readIops": "100", "writeBps": "max"})
    with pytest.raises(InvalidArgument, match="writeIops"):
        parse({"writeIops": "nope"})
    ctx = VolumeContext.from_dict(
        {"nqn": "nqn.x", "namespaceUUID": str(uuid.uuid4()), "portals": "tcp:1.2.3.4:4420", "readIops": "100"}
    )
    assert ctx.qos.get("readIops") == 100
    assert VolumeContext.from_dict(ctx.to_dict()) == ctx


@given(st.text(max_size=60))
def test_a_pod_uid_from_the_request_never_leaves_the_cgroup_root(uid: str) -> None:
    tree = PodCgroups(Path("/nonexistent-cgroup-root"))
    try:
        paths = tree.candidates(uid)
    except InvalidArgument:
        return
    assert all(p.is_relative_to(tree.root) and ".." not in p.parts for p in paths)


@pytest.mark.parametrize(
    "layout",
    [
        f"kubepods/pod{POD}",
        f"kubepods/burstable/pod{POD}",
        f"kubepods/besteffort/pod{POD}",
        f"kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice",
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice",
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD.replace('-', '_')}.slice",
    ],
)
def test_pod_cgroup_found_under_both_kubelet_layouts(tmp_path: Path, layout: str) -> None:
    tree = IoMaxTree(tmp_path / "cg")
    assert tree.find(POD) is None
    folder = tree.make_pod(layout)
    assert tree.find(POD) == folder


class PassSource:
    """The node's limits source as the agents' is: one listing per reconcile pass (``for_pass``), never a call
    per volume."""

    def __init__(self, node: Node) -> None:
        self.node, self.passes = node, 0

    def __call__(self, record: StagingRecord) -> dict[str, str] | None:
        raise AssertionError("the reconcile pass asked one volume's limits instead of using the pass's listing")

    def for_pass(self) -> Callable[[StagingRecord], dict[str, str] | None]:
        self.passes += 1
        return lambda record: self.node.agent_limits


class Node:
    def __init__(self, tmp: Path, io: bool = True, limits: dict[str, str] | None = None) -> None:
        (tmp / "dev").mkdir()
        self.tmp = tmp
        self.host = FakeHost(tmp / "mountinfo")
        self.tree = IoMaxTree(tmp / "cg", io=io)
        self.qos = QosEnforcer(self.tree, LimitOverrides(tmp / "qos"), device_number=lambda device: "259:7", wait=0.3)
        self.store = StagingStore(tmp / "records")
        self.agent_limits: dict[str, str] | None = None  # what the volume's agent holds now (None: unreachable)
        self.source = PassSource(self)
        self.svc = StagingService(
            FakeConnector(tmp / "dev"),
            Mounter(self.host, tmp / "mountinfo"),
            Filesystems(self.host),
            self.store,
            size_of=lambda d: 7,
            root=tmp,
            qos=self.qos,
            limits_source=self.source,
        )
        self.ref = VolumeRef("fake", str(uuid.uuid4()))
        self.vid = f"nvmeof-v1.fake.{self.ref.uuid}"
        context = {"readIops": "300", "writeBps": "4194304"} if limits is None else limits
        self.svc.stage(self.vid, self.ref, str(tmp / "staging"), MOUNT, context, 30)

    def publish(self, target: str = "t1", pod: str = POD) -> None:
        self.svc.publish(self.ref, str(self.tmp / "staging"), str(self.tmp / target), MOUNT, False, pod)


def test_publish_writes_the_pods_line_and_unpublish_removes_it(tmp_path: Path) -> None:
    node = Node(tmp_path)
    pod = node.tree.make_pod(f"kubepods/burstable/pod{POD}")
    node.publish("t1")
    assert node.tree.io_max(pod) == {"259:7": {"rbps": "max", "wbps": "4194304", "riops": "300", "wiops": "max"}}
    node.publish("t1")  # repeated: changes nothing
    node.publish("t2")  # the same pod at a second target path
    node.svc.unpublish(node.ref, str(tmp_path / "t1"))
    assert "259:7" in node.tree.io_max(pod), "the pod still has the volume at t2"
    node.svc.unpublish(node.ref, str(tmp_path / "t2"))
    assert node.tree.io_max(pod) == {}
    assert node.svc.health(node.ref).problems == ()


def test_an_unpublish_while_the_reconcile_pass_runs_keeps_the_line_removed(tmp_path: Path) -> None:
    """The QoS loop lists the records, then the pod is unpublished, then the loop goes on: it must act on the
    record as it is now (no pod), not re-write the line the unpublish just removed (seen in the lab)."""
    node = Node(tmp_path)
    pod = node.tree.make_pod(f"kubepods/besteffort/pod{POD}")
    node.publish("t1")
    listed = node.store.all()

    def all_then_unpublish() -> list[StagingRecord]:
        node.svc.unpublish(node.ref, str(tmp_path / "t1"))
        return listed

    node.store.all = all_then_unpublish  # type: ignore[method-assign]
    assert node.tree.io_max(pod) != {}
    assert node.svc.reconcile_limits() == []
    assert node.tree.io_max(pod) == {}, "the reconcile pass re-applied the line of an unpublished pod"


def test_unlimited_volume_writes_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, limits={})
    pod = node.tree.make_pod(f"kubepods/pod{POD}")
    node.publish()
    assert node.tree.io_max(pod) == {}
    assert node.svc.health(node.ref).problems == ()


def test_hostile_pod_uid_is_refused_before_anything_is_mounted(tmp_path: Path) -> None:
    node = Node(tmp_path)
    with pytest.raises(InvalidArgument, match="pod UID"):
        node.publish(pod="../../../../etc")
    assert node.store.load(node.ref).targets == {}  # type: ignore[union-attr]


def test_missing_pod_cgroup_is_reported_then_reconciled(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.publish()  # the pod cgroup does not exist yet: the publish still succeeds
    condition = node.svc.health(node.ref)
    assert [(p.status, p.reason) for p in condition.problems] == [("degraded", "LimitNotEnforced")]
    assert POD in condition.problems[0].message
    pod = node.tree.make_pod(
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD.replace('-', '_')}.slice"
    )
    assert node.svc.reconcile_limits() == [f"{node.vid}: limits of pod {POD} re-applied"]
    assert node.tree.io_max(pod)["259:7"]["riops"] == "300"
    assert node.svc.reconcile_limits() == []  # in force: nothing to do
    assert node.svc.health(node.ref).problems == ()


def test_live_change_at_the_agent_is_fetched_saved_and_applied_by_the_reconcile_pass(tmp_path: Path) -> None:
    node = Node(tmp_path)
    pod = node.tree.make_pod(f"kubepods/pod{POD}")
    node.publish()
    node.agent_limits = {"readIops": "300", "writeBps": "4194304"}  # unchanged: nothing to do
    assert node.svc.reconcile_limits() == []
    node.agent_limits = {"readIops": "50", "writeIops": "80", "writeBps": "max"}  # ControllerModifyVolume
    actions = node.svc.reconcile_limits()
    assert actions[0].startswith(f"{node.vid}: limits changed to") and actions[1].endswith("re-applied"), actions
    assert node.tree.io_max(pod) == {"259:7": {"rbps": "max", "wbps": "max", "riops": "50", "wiops": "80"}}
    assert node.source.passes == 2  # one listing per pass
    node.agent_limits = None  # the agent is unreachable: the limits in force stay
    assert node.svc.reconcile_limits() == []
    assert node.tree.io_max(pod)["259:7"]["riops"] == "50"
    node.tree.set_io_max(pod, "259:7 riops=max wiops=max")  # someone rewrote the line: the loop restores it
    assert node.svc.reconcile_limits() == [f"{node.vid}: limits of pod {POD} re-applied"]
    assert node.tree.io_max(pod)["259:7"]["wiops"] == "80"
    node.agent_limits = {"readIops": "max", "writeIops": "0"}  # every limit lifted: the line goes
    assert len(node.svc.reconcile_limits()) == 2
    assert node.tree.io_max(pod) == {}
    assert node.svc.reconcile_limits() == [] and node.svc.health(node.ref).problems == ()
    node.svc.unpublish(node.ref, str(tmp_path / "t1"))
    node.svc.unstage(node.ref, str(tmp_path / "staging"))
    assert list((tmp_path / "qos").iterdir()) == [], "unstage left the volume's saved limits"


def test_no_io_controller_publish_works_and_health_says_so(tmp_path: Path) -> None:
    node = Node(tmp_path, io=False)
    node.tree.make_pod(f"kubepods/pod{POD}")
    node.publish()
    problems = node.svc.health(node.ref).problems
    assert [p.reason for p in problems] == ["LimitNotEnforced"] and "io controller" in problems[0].message


def test_the_enforced_metric_names_no_pod_unless_asked(tmp_path: Path) -> None:
    """Which pods run on which node is not every scraper's business: one series per volume by default."""
    from prometheus_client import CollectorRegistry, generate_latest

    from nvmeof_csi.initiator.metrics import NodeVolumeCollector
    from nvmeof_csi.initiator.sysfs import NvmeSysfs

    node = Node(tmp_path)
    node.tree.make_pod(f"kubepods/burstable/pod{POD}")
    node.publish("t1")
    for pod_uid, wanted in ((False, f'{{volume_id="{node.vid}"}} 1.0'), (True, f'pod_uid="{POD}"')):
        registry = CollectorRegistry()
        registry.register(NodeVolumeCollector(node.store.all, NvmeSysfs(tmp_path), node.qos, pod_uid))
        lines = [line for line in generate_latest(registry).decode().splitlines() if "qos_enforced{" in line]
        assert len(lines) == 1 and wanted in lines[0], lines
        assert (POD in lines[0]) is pod_uid
