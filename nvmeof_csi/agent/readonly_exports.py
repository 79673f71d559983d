"""The read-only subsystem of each volume that has read-only hosts (``<volume NQN>:ro``), over the devices of
``agent/readonly.py`` that refuse writes. Contract: ``agent/readonly.py``'s module docstring."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvmeof_csi.agent.parts import AgentParts
from nvmeof_csi.agent.readonly import MODEL, NSID, ReadOnlyDevices
from nvmeof_csi.agent.state_model import VolumeRecord
from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.nvmeof.nqn import namespace_nguid, readonly_namespace_uuid, readonly_nqn


class ReadOnlyExports:
    """The read-only subsystem of each volume that has read-only hosts."""

    def __init__(self, parts: AgentParts) -> None:
        self._p = parts

    def _devices(self) -> ReadOnlyDevices:
        if self._p.readonly_devices is None:
            raise FailedPrecondition(
                "this agent has no way to make a device that refuses writes; read-only hosts are refused"
            )
        return self._p.readonly_devices

    def attach(self, rec: VolumeRecord) -> str:
        """The device that refuses writes over the volume's backing file (made if need be; grants nothing)."""
        return self._devices().attach(rec.uuid, self._p.store.volume_path(rec.uuid))

    def ensure(self, rec: VolumeRecord) -> None:
        p, nqn = self._p, readonly_nqn(rec.uuid)
        if not rec.readonly_hosts:
            if p.nvmet.has_subsystem(nqn):
                self.remove(rec)
            return
        device = self.attach(rec)
        ns_uuid = readonly_namespace_uuid(rec.uuid)
        p.nvmet.ensure_subsystem(nqn, serial=ns_uuid.replace("-", "")[:20], model=MODEL)
        p.nvmet.ensure_namespace(nqn, NSID, device, ns_uuid, namespace_nguid(ns_uuid))
        for host_nqn in rec.readonly_hosts:
            p.nvmet.ensure_host(host_nqn, rec.hosts.get(host_nqn, ""), rec.ctrl_keys.get(host_nqn, ""))
            p.nvmet.allow(nqn, host_nqn)
        for host_nqn in set(p.nvmet.allowed_hosts(nqn)) - set(rec.readonly_hosts):
            p.nvmet.deny(nqn, host_nqn)
        p.export(rec, nqn, rec.readonly_hosts)

    def remove(self, rec: VolumeRecord) -> None:
        p, nqn = self._p, readonly_nqn(rec.uuid)
        if p.nvmet.has_subsystem(nqn):
            p.nvmet.remove_subsystem(nqn)
        if p.readonly_devices is not None:
            p.readonly_devices.detach(rec.uuid, p.store.volume_path(rec.uuid))

    def refresh(self, rec: VolumeRecord) -> None:
        p, nqn = self._p, readonly_nqn(rec.uuid)
        if p.readonly_devices is None or not p.nvmet.has_subsystem(nqn):
            return
        p.readonly_devices.refresh(rec.uuid, p.store.volume_path(rec.uuid))
        p.nvmet.revalidate(nqn, NSID)

    @staticmethod
    def drift(rec: VolumeRecord, tree: Mapping[str, Any], port_ids: list[str]) -> str:
        """Why the observed tree (``Nvmet.dump()``) differs from the read-only half of ``rec`` ("" if it agrees)."""
        nqn = readonly_nqn(rec.uuid)
        sub = tree["subsystems"].get(nqn)
        if not rec.readonly_hosts:
            return "read-only subsystem left over" if sub is not None else ""
        if sub is None:
            return "read-only subsystem missing"
        ns = sub["namespaces"].get(str(NSID), {})
        if ns.get("enable") != "1" or ns.get("device_uuid") != readonly_namespace_uuid(rec.uuid):
            return "read-only namespace missing or disabled"
        if sorted(sub["hosts"]) != sorted(rec.readonly_hosts):
            return "read-only hosts differ"
        if any(nqn not in tree["ports"].get(port, {}).get("subsystems", []) for port in port_ids):
            return "read-only subsystem not linked to every portal"
        return ""
