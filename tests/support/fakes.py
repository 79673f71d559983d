"""Fakes of our own interfaces for fast tests: an in-memory target backend, a connector, and a host
executor that simulates mount/umount/blkid/mkfs by editing a fake mountinfo file (MockTransport style: the
real Mounter and Filesystems classes run unchanged on top of it)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from nvmeof_csi.errors import (
    CommandError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unimplemented,
)
from nvmeof_csi.host.executor import Executor, Result
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import (
    NO_SECRETS,
    Condition,
    Connector,
    ContentSource,
    Fence,
    Health,
    OrphanStats,
    Snapshot,
    TargetBackend,
    Topology,
    TopologyRequirement,
    Volume,
    VolumeRef,
)

TOPO = {"topology.csi.nvmeof.io/fabric": "f1"}


class FakeBackend:
    """In-memory TargetBackend. ``gate`` (if set) blocks create_volume until released (for lock tests)."""

    supports_snapshots = False

    def __init__(self, capacity: int = 1 << 40, location: str = "fake") -> None:
        self.capacity = capacity
        self.location = location
        self.volumes: dict[str, Volume] = {}
        self.readonly: dict[tuple[str, str], bool] = {}
        self.node_names: dict[str, str] = {}  # node ID -> the Node name its last publish gave
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.healthy = True

    def health(self) -> Health:
        return Health(self.healthy, "fake")

    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: VolumeParameters,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
        wait: float | None = None,
    ) -> Volume:
        self.entered.set()
        if (
            requirement is not None
            and requirement.requisite
            and not any(all(TOPO.get(k) == v for k, v in t.items()) for t in requirement.requisite)
        ):
            raise ResourceExhausted("no storage in the requested topology")
        if self.gate is not None:
            self.gate.wait(10)
        found = self.find_volume_by_name(name)
        if found:
            return found
        if sum(v.capacity_bytes for v in self.volumes.values()) + capacity_bytes > self.capacity:
            raise ResourceExhausted("fake backend full")
        ref = VolumeRef(self.location, str(uuid.uuid4()))
        vol = Volume(ref, name, capacity_bytes, parameters, {"fake": ref.uuid}, (dict(TOPO),))
        self.volumes[ref.uuid] = vol
        return vol

    def find_volume_by_name(
        self,
        name: str,
        parameters: VolumeParameters | None = None,
        requirement: TopologyRequirement | None = None,
        source: ContentSource | None = None,
    ) -> Volume | None:
        return next((v for v in self.volumes.values() if v.name == name), None)

    def get_volume(self, ref: VolumeRef) -> Volume | None:
        return self.volumes.get(ref.uuid) if ref.location == self.location else None

    def list_volumes(self) -> list[Volume]:
        return sorted(self.volumes.values(), key=lambda v: v.ref.uuid)

    def delete_volume(self, ref: VolumeRef) -> None:
        vol = self.get_volume(ref)
        if vol and vol.published_nodes:
            raise FailedPrecondition("published")
        self.volumes.pop(ref.uuid, None)

    def modify_volume(self, ref: VolumeRef, changes: Mapping[str, str]) -> None:
        vol = self.volumes.get(ref.uuid)
        if vol is None:
            raise NotFound(f"volume {ref.uuid} does not exist")
        self.volumes[ref.uuid] = replace(vol, parameters=vol.parameters.with_changes(changes))

    def expand_volume(self, ref: VolumeRef, capacity_bytes: int) -> int:
        vol = self.volumes[ref.uuid]
        self.volumes[ref.uuid] = replace(vol, capacity_bytes=max(vol.capacity_bytes, capacity_bytes))
        return self.volumes[ref.uuid].capacity_bytes

    def publish(
        self,
        ref: VolumeRef,
        node_id: str,
        readonly: bool,
        secrets: Mapping[str, str] = NO_SECRETS,
        node_name: str = "",
    ) -> Mapping[str, str]:
        vol = self.volumes[ref.uuid]
        from nvmeof_csi.errors import AlreadyExists

        if self.readonly.get((ref.uuid, node_id), readonly) != readonly:
            raise AlreadyExists("other readonly")
        self.readonly[(ref.uuid, node_id)] = readonly
        self.node_names[node_id] = node_name
        nodes = tuple(sorted({*vol.published_nodes, node_id}))
        self.volumes[ref.uuid] = replace(vol, published_nodes=nodes)
        return {"node": node_id}

    def unpublish(self, ref: VolumeRef, node_id: str) -> None:
        vol = self.volumes.get(ref.uuid)
        if vol:
            self.readonly.pop((ref.uuid, node_id), None)
            self.volumes[ref.uuid] = replace(vol, published_nodes=tuple(n for n in vol.published_nodes if n != node_id))

    def fence(self, ref: VolumeRef, node_id: str, reason: str, boot_id: str) -> None:
        self.unpublish(ref, node_id)
        vol = self.volumes[ref.uuid]
        self.volumes[ref.uuid] = replace(vol, fenced={**vol.fenced, node_id: Fence(reason, 0.0, boot_id)})

    def unfence(self, ref: VolumeRef, node_id: str) -> None:
        vol = self.volumes[ref.uuid]
        self.volumes[ref.uuid] = replace(vol, fenced={k: v for k, v in vol.fenced.items() if k != node_id})

    def available_capacity(self, segment: Topology | None, parameters: VolumeParameters | None = None) -> int:
        if segment and any(TOPO.get(k) != v for k, v in segment.items()):
            return 0
        return self.capacity - sum(v.capacity_bytes for v in self.volumes.values())

    def max_volume_size(self) -> int:
        return self.capacity

    def condition(self, ref: VolumeRef) -> Condition:
        return Condition(False, "ok")

    def create_snapshot(self, name: str, source: VolumeRef) -> Snapshot:
        raise Unimplemented("the fake backend has no snapshots")  # as the loop backend (supports_snapshots False)

    def find_snapshot_by_name(self, name: str) -> Snapshot | None:
        return None

    def get_snapshot(self, ref: VolumeRef) -> Snapshot | None:
        return None

    def list_snapshots(self) -> list[Snapshot]:
        return []

    def delete_snapshot(self, ref: VolumeRef) -> None:
        return None


@dataclass
class FakeConnector:
    """Connector whose devices are paths under ``dev_dir``; records calls."""

    dev_dir: Path
    calls: list[tuple[str, str]] = field(default_factory=list)
    connected: dict[str, str] = field(default_factory=dict)
    fail_connect: Exception | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    gaps: tuple[str, ...] = ()  # features asked of the node that it lacks (``initiator/features.py``)

    def health(self) -> Health:
        return Health(True, "fake", self.gaps)

    def connect(
        self, ref: VolumeRef, context: Mapping[str, str], timeout: float, secrets: Mapping[str, str] = NO_SECRETS
    ) -> str:
        self.calls.append(("connect", ref.uuid))
        if self.fail_connect:
            raise self.fail_connect
        dev = str(self.dev_dir / f"dev-{ref.uuid[:8]}")
        Path(dev).touch()
        self.connected[ref.uuid] = dev
        return dev

    def find_device(self, ref: VolumeRef, context: Mapping[str, str]) -> str | None:
        return self.connected.get(ref.uuid)

    def disconnect(self, ref: VolumeRef, context: Mapping[str, str], in_use: frozenset[VolumeRef]) -> None:
        self.calls.append(("disconnect", ref.uuid))
        self.connected.pop(ref.uuid, None)

    def refresh_size(self, ref: VolumeRef, context: Mapping[str, str], device: str) -> int:
        self.calls.append(("refresh", ref.uuid))
        return self.sizes.get(ref.uuid, 1 << 30)

    def condition(self, ref: VolumeRef, context: Mapping[str, str]) -> Condition:
        return Condition(ref.uuid not in self.connected, "fake paths")

    def check_context(self, ref: VolumeRef, context: Mapping[str, str]) -> None:
        if context.get("broken"):
            raise InvalidArgument(f"volume context of {ref.uuid} is broken")

    def refresh_keys(self, ref: VolumeRef, context: Mapping[str, str]) -> list[str]:
        return []

    def reconcile(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]], timeout: float) -> list[str]:
        self.calls.append(("reconcile", ",".join(r.uuid for r, _ in claimed)))
        return []

    def head_of(self, ref: VolumeRef) -> str | None:
        return self.connected.get(ref.uuid)

    def release_volume(self, ref: VolumeRef, in_use: frozenset[VolumeRef]) -> list[str]:
        self.calls.append(("release_volume", ref.uuid))
        self.connected.pop(ref.uuid, None)
        return [f"disconnected {ref.uuid}"]

    def retry_orphans(self, claimed: Sequence[tuple[VolumeRef, Mapping[str, str]]]) -> list[str]:
        return []

    def orphan_stats(self) -> OrphanStats:
        return OrphanStats()


class FakeHost:
    """Executor that simulates mount, umount, blkid and mkfs against a fake mountinfo file."""

    def __init__(self, mountinfo: Path) -> None:
        self.mountinfo = mountinfo
        mountinfo.write_text("")
        self.signatures: dict[str, str] = {}
        self.argvs: list[list[str]] = []
        self.fail: dict[str, CommandError] = {}
        self._next = 100
        self.readonly_devices: set[str] = set()

    def _lines(self) -> list[str]:
        return [line for line in self.mountinfo.read_text().splitlines() if line]

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
        tool = argv[0]
        if tool in self.fail:
            raise self.fail[tool]
        if tool == "blkid":
            sig = self.signatures.get(argv[-1])
            return Result(0, sig + "\n", "") if sig else Result(2, "", "")
        if tool.startswith("mkfs."):
            self.signatures[argv[-1]] = tool.split(".", 1)[1]
            return Result(0, "", "")
        if tool == "mount":
            if "-o" in argv and argv[argv.index("-o") + 1].startswith("remount"):
                return Result(0, "", "")
            source, target = argv[-2], argv[-1]
            fstype = argv[argv.index("-t") + 1] if "-t" in argv else "none"
            self._next += 1
            lines = self._lines()
            lines.append(f"{self._next} 1 0:{self._next} / {target} rw - {fstype} {source} rw")
            self.mountinfo.write_text("\n".join(lines) + "\n")
            return Result(0, "", "")
        if tool == "umount":
            lines = self._lines()
            for i in range(len(lines) - 1, -1, -1):
                if lines[i].split()[4] == argv[-1]:
                    del lines[i]
                    break
            else:
                raise CommandError(argv, 32, "", "not mounted")
            self.mountinfo.write_text("".join(line + "\n" for line in lines))
            return Result(0, "", "")
        if tool in ("resize2fs", "xfs_growfs"):
            return Result(0, "", "")
        if tool == "blockdev" and argv[1] in ("--setro", "--setrw"):
            self.readonly_devices.discard(argv[-1])
            if argv[1] == "--setro":
                self.readonly_devices.add(argv[-1])
            return Result(0, "", "")
        raise NotFound(f"FakeHost does not simulate {tool}")


class FakeClock:
    """A monotonic clock that only moves when something sleeps on it (``sleep`` advances it by at least
    ``min_step``), for code that takes ``clock`` and ``sleep`` callables."""

    def __init__(self, min_step: float = 0.0) -> None:
        self.now = 0.0
        self._min_step = min_step

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, self._min_step)


def _conforms(
    backend: FakeBackend, connector: FakeConnector, host: FakeHost
) -> tuple[TargetBackend, Connector, Executor]:
    """Never called: ``mypy --strict tests/support`` (the lint tier) checks here that each fake still
    implements the protocol it stands in for, with the protocol's signatures."""
    return backend, connector, host
