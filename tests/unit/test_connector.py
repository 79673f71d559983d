"""The NVMe-oF connector over a fake kernel: a fake ``/dev/nvme-fabrics`` (connects) and a fake ``nvme``
command (disconnects) that create and remove controllers in a sysfs-shaped temp tree, so the real connector
and sysfs model run unchanged."""

from __future__ import annotations

import errno
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.csi.volume_health import volume_health
from nvmeof_csi.errors import CommandError, DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from nvmeof_csi.gen import csi_pb2
from nvmeof_csi.host.executor import Result
from nvmeof_csi.initiator.connector import NvmeofConnector
from nvmeof_csi.initiator.fabrics import FabricsDevice, FabricsError
from nvmeof_csi.initiator.identity import HostIdentity
from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.initiator.uevents import PollingWait, UdevWait
from nvmeof_csi.nvmeof.nqn import VOLUME_NQN_PREFIX as NQN_PREFIX
from nvmeof_csi.service.contracts import VolumeRef
from tests.support.fakes import FakeClock

VOL = VolumeRef("lab", "0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c01")
OTHER = VolumeRef("lab", "0b6d5bd6-4c1e-4f55-9d7a-3e0f6f1a7c0a")
ME = HostIdentity(
    "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000001"
)


def ctx(ref: VolumeRef, portals: str = "tcp:127.0.0.1:4420,tcp:127.0.0.2:4421", **extra: str) -> dict[str, str]:
    return {"nqn": NQN_PREFIX + ref.uuid, "namespaceUUID": ref.uuid, "portals": portals, **extra}


class FakeNvme:
    def __init__(self, root: Path, multipath: bool = True) -> None:
        self.root = root
        self.argvs: list[list[str]] = []
        self.connects: list[dict[str, str | None]] = []  # option sets written to /dev/nvme-fabrics
        self.refuse: set[str] = set()
        self.failing_disconnects: set[str] = set()  # controllers whose disconnect fails (the kernel says EBUSY)
        self.ns_appears = True
        self._ctrl = itertools.count()
        self._subsys: dict[str, int] = {}
        p = root / "module" / "nvme_core" / "parameters"
        p.mkdir(parents=True)
        (p / "multipath").write_text("Y\n" if multipath else "N\n")

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        check: bool = True,
        stdin: str | None = None,
        secrets: Sequence[str] = (),
    ) -> Result:
        argv = list(argv)
        self.argvs.append(argv)
        if argv[:2] == ["nvme", "disconnect"]:  # -d CTRL, or -n NQN: every controller of that subsystem
            for name in [argv[-1]] if argv[2] == "-d" else self._controllers_of(argv[-1]):
                if name in self.failing_disconnects:
                    raise CommandError(argv, 1, "", "Failed to disconnect: Device or resource busy")
                self._remove(name)
            return Result(0, "", "")
        raise AssertionError(argv)

    def connect(self, options: Sequence[tuple[str, str | None]]) -> str:
        """What the kernel does with one write to /dev/nvme-fabrics."""
        opts = dict(options)
        self.connects.append(opts)
        addr, svc, nqn = str(opts["traddr"]), str(opts["trsvcid"]), str(opts["nqn"])
        if f"{addr}:{svc}" in self.refuse:
            raise FabricsError(errno.ECONNREFUSED, "ECONNREFUSED: Connection refused")
        for ctrl in (self.root / "class" / "nvme").glob("nvme*"):
            sub = next(s for s in (self.root / "class" / "nvme-subsystem").iterdir() if (s / ctrl.name).exists())
            if (ctrl / "address").read_text().strip() == f"traddr={addr},trsvcid={svc}" and (
                sub / "subsysnqn"
            ).read_text().strip() == nqn:
                raise FabricsError(errno.EALREADY, "EALREADY: Operation already in progress")
        return self._add(str(opts["transport"]), addr, svc, nqn)

    def _add(self, tr: str, addr: str, svc: str, nqn: str) -> str:
        if nqn not in self._subsys:
            self._subsys[nqn] = len(self._subsys)
        s = self._subsys[nqn]
        c = next(self._ctrl)
        sub = self.root / "class" / "nvme-subsystem" / f"nvme-subsys{s}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "subsysnqn").write_text(nqn + "\n")
        (sub / f"nvme{c}").mkdir()
        ctrl = self.root / "class" / "nvme" / f"nvme{c}"
        ctrl.mkdir(parents=True)
        for name, value in (
            ("state", "live"),
            ("transport", tr),
            ("address", f"traddr={addr},trsvcid={svc}"),
            ("rescan_controller", ""),
            ("fast_io_fail_tmo", "off"),
        ):
            (ctrl / name).write_text(value + "\n")
        if self.ns_appears:
            (sub / f"nvme{s}n1").mkdir(exist_ok=True)
            head = self.root / "block" / f"nvme{s}n1"
            head.mkdir(parents=True, exist_ok=True)
            (head / "uuid").write_text(nqn.removeprefix(NQN_PREFIX) + "\n")
            (head / "nsid").write_text("1\n")
            (head / "size").write_text("131072\n")
        path = self.root / "block" / f"nvme{s}c{c}n1"
        path.mkdir(parents=True)
        (path / "ana_state").write_text("optimized\n")
        return f"nvme{c}"

    def _controllers_of(self, nqn: str) -> list[str]:
        subs = [
            s
            for s in (self.root / "class" / "nvme-subsystem").iterdir()
            if (s / "subsysnqn").read_text().strip() == nqn
        ]
        return sorted(p.name for s in subs for p in s.iterdir() if p.name.startswith("nvme") and p.name[4:].isdigit())

    def _remove(self, ctrl: str) -> None:
        for sub in (self.root / "class" / "nvme-subsystem").iterdir():
            if (sub / ctrl).exists():
                (sub / ctrl).rmdir()
                for f in (self.root / "class" / "nvme" / ctrl).iterdir():
                    f.unlink()
                (self.root / "class" / "nvme" / ctrl).rmdir()
                if not any(p.name[4:].isdigit() for p in sub.iterdir() if p.name.startswith("nvme")):
                    for child in sub.iterdir():
                        child.rmdir() if child.is_dir() else child.unlink()
                    sub.rmdir()


def connector(
    tmp: Path, multipath: bool = True, single: bool = False, busy: dict[str, str] | None = None
) -> tuple[NvmeofConnector, FakeNvme]:
    fake = FakeNvme(tmp, multipath)
    clock = FakeClock()
    in_use = (busy if busy is not None else {}).get
    return NvmeofConnector(
        fake,
        NvmeSysfs(tmp),
        ME,
        single,
        sleep=clock.sleep,
        clock=clock,
        in_use=lambda dev: in_use(dev, ""),
        fabrics=KernelFabrics(fake),
    ), fake


class KernelFabrics(FabricsDevice):
    """/dev/nvme-fabrics of the fake kernel."""

    def __init__(self, fake: FakeNvme) -> None:
        super().__init__(Path("/nonexistent"))
        self.fake = fake

    def connect(self, options: Sequence[tuple[str, str | None]]) -> str:
        return self.fake.connect(options)


def test_two_portals_one_head_device_and_repeat_is_a_no_op(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    device = conn.connect(VOL, ctx(VOL, ctrlLossTmo="120", queueSize="64"), 30)
    assert device == "/dev/nvme0n1"
    first = fake.connects[0]
    assert first["hostnqn"] == ME.nqn and first["hostid"] == ME.host_id and first["transport"] == "tcp"
    assert first["ctrl_loss_tmo"] == "120" and first["queue_size"] == "64" and first["keep_alive_tmo"] == "5"
    assert "dhchap_secret" not in first and fake.argvs == []  # no nvme-cli (and its scan of every controller)
    assert conn.connect(VOL, ctx(VOL), 30) == device
    assert len(fake.connects) == 2  # already connected: nothing more
    with pytest.raises(FabricsError) as raised:  # the kernel's own answer to a repeated connect
        fake.connect(list(first.items()))
    assert raised.value.errno == errno.EALREADY
    assert conn.find_device(VOL, ctx(VOL)) == device
    assert conn.condition(VOL, ctx(VOL)).message == "2 of 2 paths live"


def test_a_dead_portal_degrades_but_a_dead_fabric_fails(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    fake.refuse = {"127.0.0.2:4421"}
    assert conn.connect(VOL, ctx(VOL), 30) == "/dev/nvme0n1"
    cond = conn.condition(VOL, ctx(VOL))
    assert cond.abnormal and cond.message == "1 of 2 paths live: tcp:127.0.0.2:4421 not connected"
    assert [(p.status, p.reason) for p in cond.issues()] == [("degraded", "PathsDown")]
    health = volume_health("v", cond)  # the CSI 1.13 message NodeGetVolumeHealth answers
    assert [(e.status, e.reason) for e in health.health_statuses] == [(csi_pb2.DEGRADED, "PathsDown")]
    assert "tcp:127.0.0.2:4421" in health.health_statuses[0].message
    assert [p.reason for p in conn.condition(OTHER, ctx(OTHER)).issues()] == ["NotConnected"]
    for state in (tmp_path / "class" / "nvme").glob("nvme*/state"):  # the last live path goes too
        state.write_text("connecting\n")
    assert [(p.status, p.reason) for p in conn.condition(VOL, ctx(VOL)).issues()] == [("inaccessible", "NoLivePath")]
    fake.refuse = {"127.0.0.1:4420", "127.0.0.2:4421"}
    with pytest.raises(Unavailable, match="no path could be connected") as refused:
        conn.connect(OTHER, ctx(OTHER), 30)
    assert "tcp:127.0.0.1:4420: " in str(refused.value) and "ECONNREFUSED" in str(refused.value)  # each path's errno


def test_multipath_off(tmp_path: Path) -> None:
    conn, _ = connector(tmp_path / "a", multipath=False)
    with pytest.raises(FailedPrecondition, match="multipath is off"):
        conn.connect(VOL, ctx(VOL), 30)
    conn, fake = connector(tmp_path / "b", multipath=False, single=True)
    conn.connect(VOL, ctx(VOL), 30)
    assert len(fake.connects) == 1 and fake.connects[0]["traddr"] == "127.0.0.1"


def test_disconnect_only_our_whole_nqn_and_only_when_unused(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    conn.connect(VOL, ctx(VOL), 30)
    conn.connect(OTHER, ctx(OTHER), 30)  # ...c01 vs ...c0a: no prefix games
    conn.disconnect(VOL, ctx(VOL), frozenset({VOL, VolumeRef("elsewhere", VOL.uuid)}))
    assert conn.find_device(VOL, ctx(VOL)) is not None  # the same subsystem is still staged elsewhere
    conn.disconnect(VOL, ctx(VOL), frozenset({OTHER}))
    assert conn.find_device(VOL, ctx(VOL)) is None
    assert conn.find_device(OTHER, ctx(OTHER)) == "/dev/nvme1n1"
    conn.disconnect(VOL, ctx(VOL), frozenset())  # absent is fine
    assert [a[2:] for a in fake.argvs if a[1] == "disconnect"] == [["-n", ctx(VOL)["nqn"]]]  # both paths, one call


def test_missing_namespace_times_out_after_a_rescan(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    fake.ns_appears = False
    with pytest.raises(DeadlineExceeded, match="did not appear"):
        conn.connect(VOL, ctx(VOL), 2)


def test_reconcile_restores_paths_and_releases_only_our_orphans(tmp_path: Path) -> None:
    conn, fake = connector(tmp_path)
    conn.connect(VOL, ctx(VOL), 30)
    conn.connect(OTHER, ctx(OTHER), 30)
    fake._add("tcp", "10.9.9.9", "4420", "nqn.2014-08.org.example:someone-elses")
    fake._remove("nvme1")  # VOL lost its second path
    actions = conn.reconcile([(VOL, ctx(VOL))], 30)  # OTHER is no longer staged: an orphan
    assert actions == [
        f"volume {VOL.uuid}: reconnected tcp:127.0.0.2:4421",
        f"disconnected {NQN_PREFIX}{OTHER.uuid}: no staged volume claims it",
    ]
    assert conn.condition(VOL, ctx(VOL)).message == "2 of 2 paths live"
    assert conn.find_device(OTHER, ctx(OTHER)) is None
    foreign = NvmeSysfs(tmp_path).subsystem("nqn.2014-08.org.example:someone-elses")
    assert foreign is not None and foreign.live()
    assert conn.reconcile([(VOL, ctx(VOL))], 30) == []  # nothing left to do


class FakeUevents:
    """Stands in for the pyudev monitor: the namespace 'arrives' with the first uevent."""

    source = "fake"

    def __init__(self, fake: FakeNvme, clock: FakeClock) -> None:
        self.fake, self.clock = fake, clock
        self.opened_before_connect: bool | None = None
        self.waits: list[float] = []

    @contextmanager
    def open(self) -> Iterator[FakeUevents]:
        self.opened_before_connect = not self.fake.connects
        yield self

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)
        self.clock.sleep(0.05)
        self.fake.ns_appears = True
        self.fake._add("tcp", "127.0.0.3", "4422", NQN_PREFIX + VOL.uuid)  # a third path carries the namespace


def test_namespace_found_on_the_uevent_not_by_sleeping(tmp_path: Path) -> None:
    fake, clock = FakeNvme(tmp_path), FakeClock()
    events = FakeUevents(fake, clock)
    conn = NvmeofConnector(
        fake,
        NvmeSysfs(tmp_path),
        ME,
        sleep=clock.sleep,
        clock=clock,
        block_events=events.open,
        fabrics=KernelFabrics(fake),
    )
    fake.ns_appears = False
    assert conn.connect(VOL, ctx(VOL), 7) == "/dev/nvme0n1"
    assert events.opened_before_connect is True, "the monitor must listen before nvme connect runs"
    assert events.waits and all(0 < w <= 7 for w in events.waits), events.waits  # bounded by the deadline
    assert len(events.waits) == 1


def test_udev_wait_drains_a_burst_and_polling_is_bounded() -> None:
    polls: list[float] = []
    queue = [object(), object(), object(), None]

    class Monitor:
        def poll(self, timeout: float) -> object | None:
            polls.append(timeout)
            return queue.pop(0) if queue else None

    UdevWait(Monitor()).wait(3.0)
    assert polls == [3.0, 0, 0, 0]
    slept: list[float] = []
    PollingWait(slept.append, 0.25).wait(10)
    PollingWait(slept.append, 0.25).wait(0.1)
    PollingWait(slept.append, 0.25).wait(-1)
    assert slept == [0.25, 0.1, 0.0]


def test_block_events_open_and_wait_for_real() -> None:
    """The real pyudev path (or the polling fallback where netlink is refused) opens, waits bounded, closes."""
    from nvmeof_csi.initiator.uevents import open_block_events

    for _ in range(2):
        with open_block_events() as events:
            assert events.source in ("udev", "polling")
            events.wait(0.05)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: {**ctx(VOL), "nqn": NQN_PREFIX + OTHER.uuid},  # another volume's subsystem
        lambda: {**ctx(VOL), "namespaceUUID": OTHER.uuid},
        lambda: {**ctx(VOL), "ctrlLossTmo": "999999"},  # out of range: could hang a node
        lambda: {**ctx(VOL), "portals": "tcp:127.0.0.1:notaport"},
        lambda: {k: v for k, v in ctx(VOL).items() if k != "nqn"},
    ],
)
def test_a_context_that_is_not_this_volumes_connects_nothing(tmp_path: Path, bad: Any) -> None:
    conn, fake = connector(tmp_path)
    with pytest.raises(InvalidArgument):
        conn.connect(VOL, bad(), 30)
    assert fake.argvs == [] and fake.connects == []
