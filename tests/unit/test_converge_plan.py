"""The agent's convergence plan is a pure function: desired state + observed tree -> actions (table-tested)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.agent import converge as c
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.state import CREATING, DELETING, READY, AgentState, SnapshotRecord, VolumeRecord
from nvmeof_csi.nvmeof.nqn import namespace_nguid, volume_nqn

U1 = "11111111-1111-4111-8111-111111111111"
U2 = "22222222-2222-4222-8222-222222222222"
S1 = "33333333-3333-4333-8333-333333333333"
HOST = "nqn.2014-08.org.nvmexpress:uuid:44444444-4444-4444-8444-444444444444"
PORTALS = (PortSpec(1, "tcp", "127.0.0.1", 4420, "a"), PortSpec(2, "tcp", "127.0.0.2", 4421, "b"))
LAYOUT = c.Layout(PORTALS, lambda u: Path(f"/pool/volumes/{u}.img"), lambda u: Path(f"/pool/snapshots/{u}.img"))
MiB = 1 << 20


def ready(uuid: str = U1, hosts: dict[str, str] | None = None) -> VolumeRecord:
    return VolumeRecord(uuid=uuid, name=f"n-{uuid[:4]}", capacity_bytes=MiB, hosts=hosts or {}, status=READY)


def tree_for(*recs: VolumeRecord, ana: dict[str, str] | None = None) -> dict[str, Any]:
    """The configfs tree a converged agent shows for ``recs``."""
    subs = {
        volume_nqn(r.uuid): {
            "allow_any_host": "0",
            "serial": "s",
            "hosts": sorted(r.hosts),
            "namespaces": {
                "1": {
                    "device_path": str(LAYOUT.volume_path(r.uuid)),
                    "device_uuid": r.uuid,
                    "device_nguid": namespace_nguid(r.uuid),
                    "enable": "1",
                }
            },
        }
        for r in recs
    }
    ports = {
        str(p.port_id): {
            "addr": [p.trtype, p.traddr, str(p.trsvcid)],
            "subsystems": sorted(subs),
            "ana": (ana or {}).get(p.group, "optimized"),
        }
        for p in PORTALS
    }
    return {"subsystems": subs, "ports": ports, "hosts": sorted({h for r in recs for h in r.hosts})}


def files_for(*recs: VolumeRecord) -> dict[Path, int]:
    return {LAYOUT.volume_path(r.uuid): r.capacity_bytes for r in recs}


def kinds(actions: list[c.Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.key) for a in actions]


def state_of(
    *recs: VolumeRecord, snaps: tuple[SnapshotRecord, ...] = (), ana: dict[str, str] | None = None
) -> AgentState:
    return AgentState({r.uuid: r for r in recs}, {s.uuid: s for s in snaps}, ana or {})


def test_converged_node_plans_nothing() -> None:
    vol = ready(hosts={HOST: ""})
    state = state_of(vol, ana={"b": "inaccessible"})
    observed = c.Observed(tree_for(vol, ana={"b": "inaccessible"}), files_for(vol))
    assert c.plan(state, LAYOUT, observed) == []


def test_after_a_reboot_everything_is_planned_back() -> None:
    vol = ready(hosts={HOST: ""})
    empty: dict[str, object] = {"subsystems": {}, "ports": {}, "hosts": []}
    got = kinds(c.plan(state_of(vol, ana={"b": "non-optimized"}), LAYOUT, c.Observed(empty, files_for(vol))))
    assert got == [(c.Kind.PORT, "1"), (c.Kind.PORT, "2"), (c.Kind.ANA, "2"), (c.Kind.VOLUME_REPAIR, U1)]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda t, f: t["subsystems"][volume_nqn(U1)]["namespaces"]["1"].update(enable="0"), "attributes"),
        (lambda t, f: t["subsystems"][volume_nqn(U1)].update(allow_any_host="1"), "attributes"),
        (lambda t, f: t["subsystems"][volume_nqn(U1)].update(hosts=[HOST]), "allowed hosts"),
        (lambda t, f: t["ports"]["2"].update(subsystems=[]), "portal"),
        (lambda t, f: f.update({LAYOUT.volume_path(U1): MiB // 2}), "short"),
        (lambda t, f: f.clear(), "missing"),
        (lambda t, f: t["subsystems"].clear(), "subsystem missing"),
    ],
)
def test_each_kind_of_drift_is_repaired(change: Any, why: str) -> None:
    vol = ready()
    tree, files = tree_for(vol), files_for(vol)
    change(tree, files)
    actions = c.plan(state_of(vol), LAYOUT, c.Observed(tree, files))
    assert kinds(actions)[0] == (c.Kind.VOLUME_REPAIR, U1) and why in actions[0].text


def test_interrupted_operations_are_finished() -> None:
    creating = VolumeRecord(uuid=U1, name="half", capacity_bytes=MiB, status=CREATING)
    deleting = ready(U2).evolve(status=DELETING)
    filling = VolumeRecord(
        uuid="55555555-5555-4555-8555-555555555555",
        name="ds",
        capacity_bytes=MiB,
        parameters={"dataset.path": "/ds"},
        status=CREATING,
    )
    snap_done = SnapshotRecord(S1, "s1", U2, MiB, status=DELETING)
    orphan = SnapshotRecord("66666666-6666-4666-8666-666666666666", "s2", "gone", MiB, status=CREATING)
    taking = SnapshotRecord("77777777-7777-4777-8777-777777777777", "s3", U1, MiB, status=CREATING)
    state = state_of(creating, deleting, filling, snaps=(snap_done, orphan, taking))
    got = kinds(c.plan(state, LAYOUT, c.Observed(tree_for(deleting), files_for(deleting))))
    assert got == [
        (c.Kind.SNAPSHOT_DELETE, S1),
        (c.Kind.SNAPSHOT_DROP, orphan.uuid),
        (c.Kind.SNAPSHOT_FINISH, taking.uuid),
        (c.Kind.VOLUME_FINISH, U1),
        (c.Kind.VOLUME_DELETE, U2),
        (c.Kind.VOLUME_FILL_LATER, filling.uuid),
    ]


@pytest.mark.parametrize("prune", [False, True])
def test_unknown_objects_are_reported_or_pruned(prune: bool) -> None:
    vol = ready()
    tree = tree_for(vol)
    tree["subsystems"]["nqn.2026-11.io.nvmeof:vol:stray"] = {"allow_any_host": "0", "hosts": [], "namespaces": {}}
    tree["ports"]["9"] = {"addr": ["tcp", "10.0.0.9", "4420"], "subsystems": [], "ana": "optimized"}
    tree["hosts"] = [HOST]
    files = {**files_for(vol), Path("/pool/volumes/orphan.img"): 1}
    got = kinds(c.plan(state_of(vol), LAYOUT, c.Observed(tree, files), prune=prune))
    kind = c.Kind.PRUNE if prune else c.Kind.UNKNOWN
    assert got == [
        (kind, "subsystem:nqn.2026-11.io.nvmeof:vol:stray"),
        (kind, "port:9"),
        (kind, f"host:{HOST}"),
        (kind, "file:/pool/volumes/orphan.img"),
    ]


def test_prune_never_removes_another_users_subsystem_or_the_port_that_exports_it() -> None:
    """Before, --prune removed every subsystem the agent's state did not know, also another user's."""
    vol = ready()
    tree = tree_for(vol)
    foreign = "nqn.2014-08.org.example:someone-elses"
    tree["subsystems"][foreign] = {"allow_any_host": "0", "hosts": [], "namespaces": {}}
    tree["ports"]["7"] = {"addr": ["tcp", "10.0.0.7", "4420"], "subsystems": [foreign], "ana": "optimized"}
    got = kinds(c.plan(state_of(vol), LAYOUT, c.Observed(tree, files_for(vol)), prune=True))
    assert got == [(c.Kind.UNKNOWN, f"subsystem:{foreign}"), (c.Kind.UNKNOWN, "port:7")]
