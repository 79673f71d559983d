"""Host grants and ANA on the target agent.

Contract: :meth:`HostOps.allow_host` / :meth:`HostOps.deny_host` are idempotent, save the grant before touching
configfs and serialise per volume; allowing a host again with another ``readonly`` raises ``AlreadyExists``;
a host secret the kernel cannot honour raises ``FailedPrecondition`` before anything is saved. ANA states are
set per portal group, saved first, under the ports lock; an unknown group is ``NotFound``.
"""

from __future__ import annotations

from nvmeof_csi.agent.parts import AgentParts, VolumeView
from nvmeof_csi.agent.portals import ANA_STATES, PortSpec
from nvmeof_csi.errors import AlreadyExists, InvalidArgument, NotFound
from nvmeof_csi.nvmeof.nqn import check_host_nqn, volume_nqn


class HostOps:
    def __init__(self, parts: AgentParts) -> None:
        self._p = parts

    def allow_host(self, vol_uuid: str, host_nqn: str, secret: str = "", readonly: bool = False) -> VolumeView:
        p = self._p
        check_host_nqn(host_nqn)
        with p.keys.hold(vol_uuid):
            rec = p.volume(vol_uuid)
            if host_nqn in rec.hosts and (host_nqn in rec.readonly_hosts) != readonly:
                raise AlreadyExists(
                    f"host {host_nqn} is already allowed on volume {vol_uuid} with readonly={not readonly}"
                )
            p.nvmet.ensure_host(host_nqn, secret)  # fails early if a secret cannot be honoured
            if rec.hosts.get(host_nqn) != secret or host_nqn not in rec.hosts:
                ro = tuple(sorted({*rec.readonly_hosts, host_nqn})) if readonly else rec.readonly_hosts
                rec = p.state.put_volume(rec.evolve(hosts={**rec.hosts, host_nqn: secret}, readonly_hosts=ro))
            p.nvmet.allow(volume_nqn(vol_uuid), host_nqn)
            return p.view(rec)

    def deny_host(self, vol_uuid: str, host_nqn: str) -> VolumeView:
        p = self._p
        check_host_nqn(host_nqn)
        with p.keys.hold(vol_uuid):
            rec = p.volume(vol_uuid)
            if host_nqn in rec.hosts:
                rec = p.state.put_volume(rec.evolve(
                    hosts={k: v for k, v in rec.hosts.items() if k != host_nqn},
                    readonly_hosts=tuple(h for h in rec.readonly_hosts if h != host_nqn),
                ))
            p.nvmet.deny(volume_nqn(vol_uuid), host_nqn)
            p.nvmet.remove_host(host_nqn)
            return p.view(rec)

    def list_portals(self) -> list[tuple[PortSpec, str]]:
        return [(portal, self._p.nvmet.ana_state(portal.port_id)) for portal in self._p.portals]

    def set_ana(self, group: str, ana_state: str) -> list[tuple[PortSpec, str]]:
        p = self._p
        if ana_state not in ANA_STATES:
            raise InvalidArgument(f"ANA state {ana_state!r} must be one of {', '.join(ANA_STATES)}")
        members = [portal for portal in p.portals if portal.group == group]
        if not members:
            groups = sorted({portal.group for portal in p.portals})
            raise NotFound(f"no portal group {group!r} on agent {p.name} (groups: {', '.join(groups)})")
        with p.ports_lock:
            p.state.put_ana(group, ana_state)
            for portal in members:
                p.nvmet.set_ana(portal.port_id, ana_state)
        return self.list_portals()
