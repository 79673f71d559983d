"""Convergence: make configfs and the pool match the saved state (run at start: configfs does not survive a
reboot, and a crash may have interrupted any operation).

Two halves:
- :func:`plan` is pure: desired state + portals + what was observed (``Nvmet.dump()`` and the pool's files
  with their sizes) -> an ordered list of :class:`Action`. Nothing that already holds produces an action, so
  a restart on a converged node plans nothing. Table-tested without configfs.
- :class:`Applier` carries the actions out through the volume and snapshot operations (each idempotent and
  holding its key) and reports what it did.

Objects the state does not know (subsystems, ports, hosts, image files) are reported as unknown, and removed
only with ``prune``; interrupted temporary files are always ours and always removed (before observing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from nvmeof_csi.agent.parts import NSID, AgentParts, portals_for
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.readonly_exports import ReadOnlyExports
from nvmeof_csi.agent.snapshots import SnapshotOps
from nvmeof_csi.agent.state import CREATING, DELETING, AgentState, VolumeRecord
from nvmeof_csi.agent.volumes import VolumeOps
from nvmeof_csi.errors import DriverError
from nvmeof_csi.nvmeof.nqn import is_driver_nqn, namespace_nguid, readonly_nqn, volume_nqn

log = logging.getLogger(__name__)


class Kind(StrEnum):
    """What an :class:`Action` does (its value is what logs and reports show)."""

    PORT = "port"  # make a portal's port
    ANA = "ana"  # set a portal group's ANA state
    SNAPSHOT_DELETE = "snapshot-delete"  # finish deleting a snapshot
    SNAPSHOT_FINISH = "snapshot-finish"  # finish taking a snapshot
    SNAPSHOT_DROP = "snapshot-drop"  # drop a snapshot being taken whose source is gone
    VOLUME_DELETE = "volume-delete"  # finish deleting a volume
    VOLUME_FINISH = "volume-finish"  # finish creating a volume
    VOLUME_REPAIR = "volume-repair"  # put a volume's configfs objects right
    VOLUME_FILL_LATER = "volume-fill-later"  # a dataset fill resumes once the agent serves
    UNKNOWN = "unknown"  # not ours or not known: reported, left alone
    PRUNE = "prune"  # not known and ours: removed (``--prune``)

    @property
    def about_snapshot(self) -> bool:
        return self in (Kind.SNAPSHOT_DELETE, Kind.SNAPSHOT_FINISH, Kind.SNAPSHOT_DROP)


@dataclass(frozen=True)
class Action:
    """One step: its ``kind``, the object it is about, and what it means."""

    kind: Kind
    key: str
    text: str


@dataclass(frozen=True)
class Observed:
    """What is there now: the configfs tree as ``Nvmet.dump()`` returns it (each port's ``subsystems`` a set), and
    pool files with their sizes."""

    tree: Mapping[str, Any]
    files: Mapping[Path, int]


@dataclass(frozen=True)
class Layout:
    """Where the desired objects live: the portals and the backing file of each volume and snapshot."""

    portals: Sequence[PortSpec]
    volume_path: Callable[[str], Path]
    snapshot_path: Callable[[str], Path]


@dataclass
class ConvergeReport:
    applied: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _plan_ports(state: AgentState, layout: Layout, tree: Mapping[str, Any]) -> list[Action]:
    actions = []
    for portal in layout.portals:
        seen = tree["ports"].get(str(portal.port_id))
        want = [portal.trtype, portal.traddr, str(portal.trsvcid)]
        if seen is None or seen["addr"] != want or seen.get("tls", False) != portal.tls:
            actions.append(Action(Kind.PORT, str(portal.port_id), f"port {portal.port_id}: {':'.join(want)}"))
        ana = state.ana.get(portal.group, "optimized")
        if (seen["ana"] if seen else "optimized") != ana:
            actions.append(Action(Kind.ANA, str(portal.port_id), f"port {portal.port_id}: ANA {ana}"))
    return actions


def _plan_snapshots(state: AgentState) -> list[Action]:
    actions = []
    for snap in state.snapshots.values():
        if snap.status == DELETING:
            actions.append(Action(Kind.SNAPSHOT_DELETE, snap.uuid, f"finished deleting snapshot {snap.uuid}"))
        elif snap.status == CREATING and snap.source_volume in state.volumes:
            actions.append(Action(Kind.SNAPSHOT_FINISH, snap.uuid, f"finished snapshot {snap.uuid}"))
        elif snap.status == CREATING:
            actions.append(Action(Kind.SNAPSHOT_DROP, snap.uuid, f"dropped snapshot {snap.uuid} whose source is gone"))
    return actions


def volume_drift(rec: VolumeRecord, layout: Layout, observed: Observed) -> str:
    """Why configfs or the pool differ from a ready volume's record ("" when they agree)."""
    if rec.replica:  # its DRBD stack is not in configfs: brought up again (idempotent) at every start
        return "replicated: device stack and role checked"
    path = layout.volume_path(rec.uuid)
    if observed.files.get(path, -1) < rec.capacity_bytes:
        return "backing file missing or short"
    nqn = volume_nqn(rec.uuid)
    sub = observed.tree["subsystems"].get(nqn)
    if sub is None:
        return "subsystem missing"
    ns = sub["namespaces"].get(str(NSID), {})
    want = {"device_path": str(path), "device_uuid": rec.uuid, "device_nguid": namespace_nguid(rec.uuid), "enable": "1"}
    if any(ns.get(k) != v for k, v in want.items()) or sub["allow_any_host"] != "0":
        return "namespace or subsystem attributes differ"
    writers = [h for h in rec.hosts if h not in rec.readonly_hosts]
    if sorted(sub["hosts"]) != sorted(writers) or not set(rec.hosts) <= set(observed.tree["hosts"]):
        return "allowed hosts differ"
    port_ids = [str(p.port_id) for p in portals_for(rec, layout.portals)]
    if any(nqn not in observed.tree["ports"].get(port, {}).get("subsystems", []) for port in port_ids):
        return "not linked to every portal"
    if any(nqn in seen.get("subsystems", []) for port, seen in observed.tree["ports"].items() if port not in port_ids):
        return "linked to a portal of the other kind (TLS / clear text)"
    return ReadOnlyExports.drift(rec, observed.tree, port_ids)


def _plan_volumes(state: AgentState, layout: Layout, observed: Observed) -> list[Action]:
    actions = []
    for rec in state.volumes.values():
        if rec.status == DELETING:
            actions.append(Action(Kind.VOLUME_DELETE, rec.uuid, f"finished deleting volume {rec.uuid}"))
        elif rec.status == CREATING and rec.options.dataset is not None:
            actions.append(
                Action(
                    Kind.VOLUME_FILL_LATER, rec.uuid, f"volume {rec.uuid}: dataset hydration resumes in the background"
                )
            )
        elif rec.status == CREATING:
            actions.append(Action(Kind.VOLUME_FINISH, rec.uuid, f"finished creating volume {rec.uuid}"))
        elif why := volume_drift(rec, layout, observed):
            actions.append(Action(Kind.VOLUME_REPAIR, rec.uuid, f"repaired volume {rec.uuid} ({why})"))
    return actions


def _plan_unknown(state: AgentState, layout: Layout, observed: Observed, prune: bool) -> list[Action]:
    kind = Kind.PRUNE if prune else Kind.UNKNOWN
    known_nqns = {volume_nqn(u) for u in state.volumes} | {readonly_nqn(u) for u in state.volumes}
    known_ports = {str(p.port_id) for p in layout.portals}
    known_hosts = {h for v in state.volumes.values() for h in v.hosts}
    kept_snaps = [s.uuid for s in state.snapshots.values() if s.status != CREATING or s.source_volume in state.volumes]
    known_files = {layout.volume_path(u) for u in state.volumes} | {layout.snapshot_path(u) for u in kept_snaps}
    tree = observed.tree

    def ours(nqn: str) -> Kind:  # --prune never removes another user's subsystem, nor a port that exports one
        return kind if is_driver_nqn(nqn) else Kind.UNKNOWN

    def port_kind(port: str) -> Kind:
        return kind if all(is_driver_nqn(n) for n in tree["ports"][port].get("subsystems", [])) else Kind.UNKNOWN

    return [
        *(Action(ours(n), f"subsystem:{n}", f"subsystem {n}") for n in tree["subsystems"] if n not in known_nqns),
        *(Action(port_kind(p), f"port:{p}", f"port {p}") for p in tree["ports"] if p not in known_ports),
        *(Action(kind, f"host:{h}", f"host {h}") for h in tree["hosts"] if h not in known_hosts),
        *(Action(kind, f"file:{f}", f"file {f}") for f in sorted(observed.files) if f not in known_files),
    ]


def plan(state: AgentState, layout: Layout, observed: Observed, prune: bool = False) -> list[Action]:
    """The actions that make ``observed`` match ``state``: ports, snapshots, volumes, then unknown objects."""
    return [
        *_plan_ports(state, layout, observed.tree),
        *_plan_snapshots(state),
        *_plan_volumes(state, layout, observed),
        *_plan_unknown(state, layout, observed, prune),
    ]


class Applier:
    """Carries out a plan on the real parts (configfs, pool, state)."""

    def __init__(self, parts: AgentParts, volumes: VolumeOps, snapshots: SnapshotOps) -> None:
        self._p = parts
        self._volumes = volumes
        self._snapshots = snapshots

    def observe(self) -> Observed:
        files = {}
        for path in self._p.store.files():
            try:
                files[path] = path.stat().st_size
            except FileNotFoundError:
                continue
        tree = self._p.nvmet.dump()
        for port in tree["ports"].values():  # membership tests per volume: a set, not a list of every subsystem
            port["subsystems"] = frozenset(port.get("subsystems", ()))
        return Observed(tree, files)

    def converge(self, prune: bool = False) -> ConvergeReport:
        p = self._p
        report = ConvergeReport()
        p.store.prepare()
        for tmp in p.store.sweep_temp():
            report.applied.append(f"removed interrupted file {tmp.name}")
        layout = Layout(p.portals, p.store.volume_path, p.store.snapshot_path)
        for action in plan(p.state.current, layout, self.observe(), prune):
            try:
                self._apply(action, report)
            except DriverError as err:
                report.problems.append(f"{action.kind} {action.key}: {err}")
        log.info(
            "converged: %d applied, %d unknown, %d pruned, %d problems",
            len(report.applied),
            len(report.unknown),
            len(report.pruned),
            len(report.problems),
        )
        return report

    def _apply(self, action: Action, report: ConvergeReport) -> None:
        if action.kind == Kind.UNKNOWN:
            report.unknown.append(action.text)
            return
        if action.kind == Kind.PRUNE:
            self._prune(action.key)
            report.pruned.append(action.text)
            return
        if action.kind in (Kind.PORT, Kind.ANA):
            self._port(action)
        elif action.kind.about_snapshot:
            self._snapshot(action)
        elif action.kind != Kind.VOLUME_FILL_LATER:  # fills resume once the agent serves (they can take minutes)
            self._volume(action)
        report.applied.append(action.text)
        log.info("converge: %s", action.text)  # what a start after a crash or a power cut put right, one by one

    def _port(self, action: Action) -> None:
        p = self._p
        portal = next(x for x in p.portals if str(x.port_id) == action.key)
        with p.ports_lock:
            if action.kind == Kind.PORT:
                p.nvmet.ensure_port(portal)
            else:
                p.nvmet.set_ana(portal.port_id, p.state.current.ana.get(portal.group, "optimized"))

    def _snapshot(self, action: Action) -> None:
        p = self._p
        with p.keys.hold(action.key):
            snap = p.state.current.snapshots[action.key]
            if action.kind == Kind.SNAPSHOT_DELETE:
                self._snapshots.remove_snapshot(snap)
            elif action.kind == Kind.SNAPSHOT_FINISH:
                self._snapshots.take_snapshot(snap)
            else:
                p.state.drop_snapshot(snap.uuid)

    def _volume(self, action: Action) -> None:
        p = self._p
        with p.keys.hold(action.key):
            rec = p.state.current.volumes[action.key]
            if action.kind == Kind.VOLUME_DELETE:
                self._volumes.teardown(rec)
            else:
                self._volumes.materialize(rec)

    def _prune(self, key: str) -> None:
        kind, _, name = key.partition(":")
        nvmet, store = self._p.nvmet, self._p.store
        if kind == "subsystem":
            nvmet.remove_subsystem(name)
        elif kind == "port":
            nvmet.remove_port(int(name))
        elif kind == "host":
            nvmet.remove_host(name)
        else:
            store.delete(Path(name))
