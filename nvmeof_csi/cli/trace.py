"""``nvmeofctl trace VOLUME``: one volume from end to end on one screen, for an incident.

Target side (from the agent that holds it): subsystem NQN, namespace UUID, backing file, status and health,
every portal with its portal group and ANA state, the allowed hosts. With ``--node`` (run on the GPU node):
this node's host NQN, the controllers (paths) of the subsystem with their state and portal, the namespace's
native-multipath head disk with each path's ANA state, the mounts of that disk, and the node plugin's staging
record (staging path, published targets and pods, the I/O limits and whether they are in force).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from nvmeof_csi.cli.context import Output, parse_volume, state
from nvmeof_csi.cli.output import as_dict, human_bytes, render
from nvmeof_csi.errors import NotFound
from nvmeof_csi.host.cgroups import PodCgroups
from nvmeof_csi.initiator.sysfs import NvmeSysfs
from nvmeof_csi.service.qos import LimitOverrides, QosEnforcer
from nvmeof_csi.service.records import StagingStore


def _agent_side(ctx: typer.Context, volume: str) -> dict[str, Any]:
    cli = state(ctx)
    target, vol_uuid, name = parse_volume(volume)
    names = {t.name for t in cli.pick(None)}
    for t in cli.pick(target if target in names else None):
        with cli.client(t) as client:
            try:
                found = client.get_volume(vol_uuid=vol_uuid) if vol_uuid else client.get_volume(name=name or "")
            except NotFound:
                continue
        doc = as_dict(found)
        doc["agent"] = t.name
        return doc
    raise NotFound(f"volume {volume!r} is on none of the targets")


def _mounts(device: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[str]:
    try:
        rdev = os.stat(device).st_rdev
    except OSError:
        return []
    number = f"{os.major(rdev)}:{os.minor(rdev)}"
    return [line.split()[4] for line in mountinfo.read_text().splitlines() if line.split()[2] == number]


def node_side(
    nqn: str, ns_uuid: str, state_dir: Path, cgroup_root: Path, sys_root: Path = Path("/sys")
) -> dict[str, Any]:
    """What this node sees of the volume: identity, controllers, head disk, paths, mounts, staging record."""
    sysfs = NvmeSysfs(sys_root)
    node: dict[str, Any] = {"hostnqn": _read(Path("/etc/nvme/hostnqn"))}
    sub = sysfs.subsystem(nqn)
    if sub is None:
        node["connected"] = False
    else:
        portal = {c.name: c.portal for c in sub.controllers}
        node["controllers"] = [{"name": c.name, "portal": c.portal, "state": c.state} for c in sub.controllers]
        ns = next((n for n in sub.namespaces if n.uuid.lower() == ns_uuid.lower()), None)
        if ns is not None:
            device = f"/dev/{ns.name}"
            node["device"] = {
                "path": device,
                "size": human_bytes(ns.size_bytes),
                "mounts": _mounts(device),
                "paths": [
                    {"controller": p.controller, "portal": portal.get(p.controller, ""), "ana_state": p.ana_state}
                    for p in ns.paths
                ],
            }
    record = next((r for r in StagingStore(state_dir / "staging").all() if r.ref.uuid == ns_uuid), None)
    if record is not None:
        qos = QosEnforcer(PodCgroups(cgroup_root), LimitOverrides(state_dir / "qos"))
        limits = qos.wanted(record)
        node["staging"] = {
            "path": record.staging_path,
            "targets": dict(record.targets),
            "pods": dict(record.pods),
            "limits": dict(limits.values),
            "limits_in_force": [
                {"pod": p.pod_uid, "enforced": p.enforced, "reason": p.reason} for p in qos.status(record)
            ],
        }
    return node


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def e(value: Any) -> str:
    """A server string as rich shows it literally (an NQN a node chose may hold ``[`` and ``]``)."""
    return escape(str(value))


def _tree(doc: dict[str, Any]) -> Tree:
    tree = Tree(
        f"[bold]{e(doc.get('name') or doc['uuid'])}[/] ({e(human_bytes(doc.get('capacity_bytes', 0)))}, "
        f"{e(doc.get('status', ''))}) on agent [bold]{e(doc['agent'])}[/]"
    )
    health = doc.get("health") or []
    tree.add("health: " + ("; ".join(f"{e(h['status'])} {e(h['reason'])}: {e(h['message'])}" for h in health) or "ok"))
    sub = tree.add(f"subsystem {e(doc['nqn'])}")
    sub.add(f"namespace {e(doc['namespace_uuid'])} <- {e(doc.get('backing_file', ''))}")
    ports = sub.add("portals")
    for p in doc.get("portals", []):
        ports.add(f"{e(p['trtype'])}:{e(p['traddr'])}:{e(p['trsvcid'])} group {e(p['group'])}: {e(p['ana_state'])}")
    hosts = sub.add("allowed hosts")
    for host in doc.get("allowed_hosts", []):
        hosts.add(e(host) + (" (read-only)" if host in doc.get("readonly_hosts", []) else ""))
    node = doc.get("node")
    if node is not None:
        branch = tree.add(f"this node {e(node.get('hostnqn', ''))}")
        if node.get("connected") is False:
            branch.add("[red]not connected to the subsystem[/]")
        for c in node.get("controllers", []):
            branch.add(f"controller {e(c['name'])} {e(c['portal'])}: {e(c['state'])}")
        device = node.get("device")
        if device:
            disk = branch.add(f"device {e(device['path'])} ({e(device['size'])})")
            for p in device["paths"]:
                disk.add(f"path {e(p['controller'])} {e(p['portal'])}: ANA {e(p['ana_state'])}")
            for m in device["mounts"]:
                disk.add(f"mounted at {e(m)}")
        staging = node.get("staging")
        if staging:
            rec = branch.add(f"staged at {e(staging['path'])}")
            for target, ro in staging["targets"].items():
                pod = staging["pods"].get(target, "")
                rec.add(f"published at {e(target)}{' (ro)' if ro else ''}{' for pod ' + e(pod) if pod else ''}")
            if staging["limits"]:
                lim = rec.add("limits " + ", ".join(f"{e(k)}={e(v)}" for k, v in staging["limits"].items()))
                for p in staging["limits_in_force"]:
                    verdict = "in force" if p["enforced"] else f"[red]NOT in force[/]: {e(p['reason'])}"
                    lim.add(f"pod {e(p['pod'])}: {verdict}")
    return tree


def trace(
    ctx: typer.Context,
    volume: Annotated[str, typer.Argument(help="CSI volume ID (nvmeof-v1.<agent>.<uuid>), volume UUID or CSI name.")],
    node: Annotated[bool, typer.Option("--node", help="Also what this node sees (run it on the GPU node).")] = False,
    state_dir: Annotated[Path, typer.Option(help="The node plugin's --state-dir (staging records).")] = Path(
        "/var/lib/nvmeof-csi"
    ),
    cgroup_root: Annotated[Path, typer.Option(help="The cgroup v2 mount kubelet uses.")] = Path("/sys/fs/cgroup"),
) -> None:
    """Volume -> agent -> subsystem -> namespace and backing file -> portals with ANA state -> allowed hosts ->
    (--node) controllers, paths and their states -> device -> mounts -> staging record and limits."""
    doc = _agent_side(ctx, volume)
    if node:
        doc["node"] = node_side(doc["nqn"], doc["namespace_uuid"], state_dir, cgroup_root)
    cli = state(ctx)
    if cli.output is Output.TABLE:
        Console(width=160).print(_tree(doc))
    else:
        render([doc], (), cli.output)
