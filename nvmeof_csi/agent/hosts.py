"""Host grants and ANA on the target agent.

Contract: :meth:`HostOps.allow_host` / :meth:`HostOps.deny_host` are idempotent, save the grant before
touching configfs and serialise per volume and per host; allowing a host again
with another ``readonly`` raises ``AlreadyExists``; a host secret the kernel cannot honour raises
``FailedPrecondition`` before anything is saved; a host fenced from the volume (``agent/fencing.py``) raises
``FailedPrecondition``. A read-only host is allowed only on the volume's read-only subsystem, whose namespace refuses
writes (``agent/readonly.py``); a node that cannot make such a device refuses it (``FailedPrecondition``, before
anything is saved). DH-HMAC-CHAP: a host allowed on a volume created with ``auth`` (its parameters) without keys
gets the keys this agent issued to it before, else new random ones (``nvmeof/dhchap.py``); keys given are checked
(malformed -> ``InvalidArgument``); :meth:`HostOps.host_keys` returns them (``NotFound`` when the host is not allowed).
A grant records the Kubernetes Node the controller says the host is (``node_name``; a later grant with a name
replaces it, one without keeps it): the API layer gives a node certificate of another Node nothing of the volume.
nvmet keys are per host, so a host that already reaches another volume of this agent with other keys (or none) is
refused with ``FailedPrecondition``: one secret per node, never a silent overwrite that would lock the other
volume's reconnects out. ANA states are set per portal group, saved first, under the ports lock; an unknown group
is ``NotFound``.
"""

from __future__ import annotations

import logging

from nvmeof_csi.agent.parts import AgentParts, VolumeView, wants_tls
from nvmeof_csi.agent.portals import PortSpec
from nvmeof_csi.agent.readonly_exports import ReadOnlyExports
from nvmeof_csi.agent.state import VolumeRecord
from nvmeof_csi.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from nvmeof_csi.nvmeof.context import ANA_STATES
from nvmeof_csi.nvmeof.dhchap import generate_key, parse_key
from nvmeof_csi.nvmeof.nqn import check_host_nqn, readonly_nqn, volume_nqn
from nvmeof_csi.nvmeof.tlspsk import generate_psk

log = logging.getLogger(__name__)


class HostOps:
    def __init__(self, parts: AgentParts) -> None:
        self._p = parts

    def allow_host(
        self,
        vol_uuid: str,
        host_nqn: str,
        secret: str = "",
        readonly: bool = False,
        ctrl_secret: str = "",
        node_name: str = "",
    ) -> VolumeView:
        p = self._p
        check_host_nqn(host_nqn)
        for key in filter(None, (secret, ctrl_secret)):
            parse_key(key)
        with p.keys.hold(vol_uuid), p.keys.hold(f"host:{host_nqn}"):
            rec = p.volume(vol_uuid)
            fence = rec.fenced.get(host_nqn)
            if fence is not None:
                raise FailedPrecondition(
                    f"host {host_nqn} is fenced from volume {vol_uuid} ({fence['reason']}, at {fence['at']:.0f}); "
                    "it may be allowed again once its node rebooted or an operator unfenced it "
                    "(nvmeofctl hosts unfence)"
                )
            if host_nqn in rec.hosts and (host_nqn in rec.readonly_hosts) != readonly:
                raise AlreadyExists(
                    f"host {host_nqn} is already allowed on volume {vol_uuid} with readonly={not readonly}"
                )
            if not secret:
                secret, ctrl_secret = self._issued(rec, host_nqn)
            self._check_keys(rec, host_nqn, secret, ctrl_secret)
            rec = self._with_psk(rec, host_nqn)
            p.nvmet.ensure_host(host_nqn, secret, ctrl_secret)  # fails early if a secret cannot be honoured
            if readonly:  # fails early if this node cannot make a device that refuses writes
                ReadOnlyExports(p).attach(rec)
            node_name = node_name or rec.host_nodes.get(host_nqn, "")
            granted = (rec.hosts.get(host_nqn), rec.ctrl_keys.get(host_nqn, ""), rec.host_nodes.get(host_nqn, ""))
            if granted != (secret, ctrl_secret, node_name):
                ro = tuple(sorted({*rec.readonly_hosts, host_nqn})) if readonly else rec.readonly_hosts
                ctrl_keys = {h: k for h, k in rec.ctrl_keys.items() if h != host_nqn}
                if ctrl_secret:
                    ctrl_keys[host_nqn] = ctrl_secret
                nodes = {h: n for h, n in rec.host_nodes.items() if h != host_nqn}
                if node_name:
                    nodes[host_nqn] = node_name
                rec = p.state.put_volume(
                    rec.evolve(
                        hosts={**rec.hosts, host_nqn: secret},
                        ctrl_keys=ctrl_keys,
                        readonly_hosts=ro,
                        host_nodes=nodes,
                    )
                )
            if readonly:
                ReadOnlyExports(p).ensure(rec)
            else:
                p.put_psks(rec, volume_nqn(vol_uuid), [host_nqn])
                p.nvmet.allow(volume_nqn(vol_uuid), host_nqn)
            return p.view(rec)

    def _with_psk(self, rec: VolumeRecord, host_nqn: str) -> VolumeRecord:
        """``rec`` with ``host_nqn``'s TLS PSK (``tls: psk`` volumes; saved before any kernel sees it): the one this
        agent issued to that host before, on any volume, else a new random one. Caller holds the host's key."""
        if not wants_tls(rec) or rec.tls_keys.get(host_nqn):
            return rec
        psk = next((v.tls_keys[host_nqn] for v in self._p.live_volumes() if v.tls_keys.get(host_nqn)), "")
        return self._p.state.put_volume(rec.evolve(tls_keys={**rec.tls_keys, host_nqn: psk or generate_psk()}))

    def _issued(self, rec: VolumeRecord, host_nqn: str) -> tuple[str, str]:
        """The keys this agent gives ``host_nqn`` on ``rec`` (``auth`` volumes only): the ones it already issued
        to that host (on this volume or another), else new random ones. Caller holds the host's key."""
        mode = rec.options.auth
        if mode == "none":
            return "", ""
        for other in [rec, *self._p.live_volumes()]:
            if other.hosts.get(host_nqn):
                return other.hosts[host_nqn], other.ctrl_keys.get(host_nqn, "")
        return generate_key(), generate_key() if mode == "dhchap-bidirectional" else ""

    def host_keys(self, vol_uuid: str, host_nqn: str) -> tuple[str, str, str]:
        """(key, controller key, TLS PSK) issued to ``host_nqn`` on a volume that allows it; ``NotFound``
        otherwise."""
        check_host_nqn(host_nqn)
        rec = self._p.volume(vol_uuid)
        if host_nqn not in rec.hosts:
            raise NotFound(f"host {host_nqn} is not allowed on volume {vol_uuid}")
        return rec.hosts[host_nqn], rec.ctrl_keys.get(host_nqn, ""), rec.tls_keys.get(host_nqn, "")

    def rotate_host_key(self, host_nqn: str, controller_key: bool = False) -> list[str]:
        """A new random key (the host's, or its controller key) on every volume that gives ``host_nqn`` one, saved
        record by record, then written to configfs; returns those volumes' UUIDs. A crash midway leaves some
        records with the new key: running the rotation again makes them all one new key. ``NotFound`` when no
        volume gives the host such a key."""
        p = self._p
        check_host_nqn(host_nqn)
        table = "ctrl_keys" if controller_key else "hosts"
        holders = [v.uuid for v in p.live_volumes() if getattr(v, table).get(host_nqn)]
        if not holders:
            which = "controller key" if controller_key else "DH-HMAC-CHAP key"
            raise NotFound(f"no volume on agent {p.name} gives host {host_nqn} a {which}")
        new_key = generate_key()
        with p.keys.hold(f"host:{host_nqn}", *holders):
            done = []
            for vol_uuid in holders:
                rec = p.state.current.volumes.get(vol_uuid)
                if rec is None or not getattr(rec, table).get(host_nqn):
                    continue
                p.state.put_volume(rec.evolve(**{table: {**getattr(rec, table), host_nqn: new_key}}))
                done.append(vol_uuid)
            rec = p.state.current.volumes[done[0]] if done else None
            if rec is not None and host_nqn in p.nvmet.hosts():
                p.nvmet.ensure_host(host_nqn, rec.hosts[host_nqn], rec.ctrl_keys.get(host_nqn, ""))
        log.warning(
            "host %s: new %s on %d volume(s)", host_nqn, "controller key" if controller_key else "key", len(done)
        )
        return done

    def finish_rotations(self) -> list[str]:
        """At start: a host whose volumes disagree on a key (a rotation a killed agent left half done) gets one new
        key on all of them (the rotation run again); returns ``host (key)`` or ``host (controller key)`` of each."""
        finished = []
        for table, controller_key in (("hosts", False), ("ctrl_keys", True)):
            seen: dict[str, set[str]] = {}
            for rec in self._p.live_volumes():
                for host_nqn, key in getattr(rec, table).items():
                    if key:
                        seen.setdefault(host_nqn, set()).add(key)
            for host_nqn in sorted(h for h, keys in seen.items() if len(keys) > 1):
                self.rotate_host_key(host_nqn, controller_key)
                finished.append(f"{host_nqn} ({'controller key' if controller_key else 'key'})")
        return finished

    def _check_keys(self, rec: VolumeRecord, host_nqn: str, secret: str, ctrl_secret: str) -> None:
        mode = rec.options.auth
        if mode == "none" and (secret or ctrl_secret):
            raise InvalidArgument(f"volume {rec.uuid} was created with auth 'none'; a host key cannot be set")
        if mode != "none" and not secret:
            raise FailedPrecondition(f"volume {rec.uuid} needs DH-HMAC-CHAP ({mode}); no host key was given")
        if mode == "dhchap-bidirectional" and not ctrl_secret:
            raise FailedPrecondition(f"volume {rec.uuid} needs bidirectional DH-HMAC-CHAP; no controller key was given")
        for other in self._p.live_volumes():
            if other.uuid == rec.uuid or host_nqn not in other.hosts:
                continue
            if (other.hosts[host_nqn], other.ctrl_keys.get(host_nqn, "")) != (secret, ctrl_secret):
                had = "no DH-HMAC-CHAP key" if not other.hosts[host_nqn] else "other DH-HMAC-CHAP keys"
                raise FailedPrecondition(
                    f"host {host_nqn} already reaches volume {other.uuid} of this agent with {had}; nvmet keeps "
                    "keys per host, so every volume of one node must use the same auth mode and secret"
                )

    def deny_host(self, vol_uuid: str, host_nqn: str) -> VolumeView:
        p = self._p
        with p.holding(vol_uuid, host_nqn) as found:
            rec = found
            if host_nqn in rec.hosts:
                rec = p.state.put_volume(rec.without_host(host_nqn))
            p.nvmet.deny(volume_nqn(vol_uuid), host_nqn)
            ReadOnlyExports(p).ensure(rec)  # off the read-only subsystem too (gone with its last host)
            p.nvmet.remove_host(host_nqn)
            p.drop_psks(rec, [host_nqn])
            if host_nqn in found.hosts and not rec.hosts:  # its last host: a node that never disconnected is cut off
                ended = p.cycle_links([volume_nqn(vol_uuid), readonly_nqn(vol_uuid)])
                log.info("host %s denied on volume %s; its connections ended on ports %s", host_nqn, vol_uuid, ended)
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
