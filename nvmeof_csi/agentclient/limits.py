"""What the node reads from the target agents with its own identity (the agent's ``node`` role: only the volumes
that allow this node's host NQN): a staged volume's current mutable parameters (its per-pod I/O limits,
:class:`AgentLimits`, the node's :data:`~nvmeof_csi.service.qos.LimitsSource`) and the DH-HMAC-CHAP keys the
volume's agent issued to this node (:class:`AgentHostKeys`, the connector's key source).

Contract: clients are kept per agent (:class:`AgentClients`), made with the node's own identity when it has one
(:meth:`AgentClients.use_identity`: its certificate and key replace the fabric map's; the map's CA still
checks the agents), and made anew after :meth:`AgentClients.reset` (a renewed certificate).
:class:`AgentLimits` returns ``None`` when the volume's agent is not in the fabric map (the agent is the one
the volume ID names, never one a context names); its :meth:`AgentLimits.for_pass` answers a whole reconcile
pass with one listing per agent.
:class:`AgentHostKeys` raises ``FailedPrecondition`` when the agent is not in the map (an ``auth`` volume cannot
be connected without its keys). Both raise the agent client's ``DriverError`` when it cannot be reached. Keys are
never logged.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from nvmeof_csi.agentclient.api import AgentApi, default_client
from nvmeof_csi.errors import DriverError, FailedPrecondition, Unavailable
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.dhchap import HostKeys
from nvmeof_csi.nvmeof.qos import QOS_KEY_NAMES
from nvmeof_csi.rpc.endpoints import TlsFiles
from nvmeof_csi.service.contracts import VolumeRef
from nvmeof_csi.service.records import StagingRecord
from nvmeof_csi.topology.fabric_map import AgentEntry, FabricMap


class AgentClients:
    """One client per agent of the fabric map, made on first use."""

    def __init__(self, fabric: FabricMap, client: Callable[[AgentEntry], AgentApi] = default_client) -> None:
        self._fabric = fabric
        self._factory = client
        self._clients: dict[str, AgentApi] = {}
        self._identity: tuple[Path, Path] | None = None
        self._lock = threading.Lock()

    def use_identity(self, cert: Path, key: Path) -> None:
        """Reach every TLS agent with this certificate and key from now on."""
        with self._lock:
            self._identity = (cert, key)
        self.reset()

    def reset(self) -> None:
        """Forget every client: the next call makes a new one (with the files as they are now). A call in
        flight on an old one finishes; its channel closes when the last reference goes."""
        with self._lock:
            self._clients = {}

    def _entry(self, entry: AgentEntry) -> AgentEntry:
        ca = entry.tls.ca if entry.tls is not None else entry.ca
        if self._identity is None or ca is None:
            return entry
        cert, key = self._identity
        if not (cert.is_file() and key.is_file()):
            raise Unavailable(f"agent {entry.name}: this node's identity is not issued yet ({cert})")
        return dataclasses.replace(entry, tls=TlsFiles(cert, key, ca))

    def for_agent(self, name: str) -> AgentApi | None:
        entry = self._fabric.agent(name)
        if entry is None:
            return None
        with self._lock:  # one client (one channel) per agent: made once, not on every call
            client = self._clients.get(entry.name)
            if client is None:
                client = self._clients[entry.name] = self._factory(self._entry(entry))
            return client


class AgentLimits:
    def __init__(self, clients: AgentClients) -> None:
        self._clients = clients

    def __call__(self, record: StagingRecord) -> Mapping[str, str] | None:
        """One volume's limits, asked of its agent (one GetVolume)."""
        client = self._clients.for_agent(record.ref.location)
        if client is None:
            return None
        return _limits(client.get_volume(vol_uuid=record.ref.uuid))

    def for_pass(self) -> Callable[[StagingRecord], Mapping[str, str] | None]:
        """A source for one reconcile pass: each agent is listed once (ListVolumes, which shows this node only
        the volumes that allow it), on the first volume of that agent the pass asks about; a volume the listing
        lacks is asked of its agent alone. A pass costs one call per agent, not one per volume."""
        listed: dict[str, dict[str, Mapping[str, str]]] = {}
        failed: set[str] = set()  # not listed in this pass: its other volumes wait for the next pass

        def limits(record: StagingRecord) -> Mapping[str, str] | None:
            agent = record.ref.location
            client = self._clients.for_agent(agent)
            if client is None or agent in failed:
                return None
            if agent not in listed:
                try:
                    listed[agent] = {v.uuid: _limits(v) for v in client.list_volumes()}
                except DriverError:
                    failed.add(agent)
                    raise
            found = listed[agent].get(record.ref.uuid)
            return found if found is not None else self(record)

        return limits


def _limits(volume: pb.Volume) -> Mapping[str, str]:
    return {k: v for k, v in volume.parameters.items() if k in QOS_KEY_NAMES}


class AgentHostKeys:
    """The keys the volume's agent issued to ``host_nqn`` (this node's own host NQN)."""

    def __init__(self, clients: AgentClients, host_nqn: str) -> None:
        self._clients = clients
        self._host = host_nqn

    def __call__(self, ref: VolumeRef) -> HostKeys:
        """Asked of the agent the volume ID names (never one a volume context names)."""
        client = self._clients.for_agent(ref.location)
        if client is None:
            raise FailedPrecondition(
                f"volume {ref.uuid} uses DH-HMAC-CHAP, and its agent {ref.location!r} is not in this node's "
                "fabric map (--fabric-map), so the node cannot fetch the keys the agent issued to it"
            )
        keys = client.get_host_keys(ref.uuid, self._host)
        return HostKeys(keys.dhchap_secret, keys.dhchap_ctrl_secret, keys.tls_psk)
