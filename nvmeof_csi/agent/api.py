"""The agent's gRPC servicer: translate ``nvmeof_agent.proto`` messages to :class:`TargetAgent` calls.

Every field of every request is validated here, before anything runs: UUIDs must be canonical UUIDs, host
NQNs valid NQNs, names and maps bounded and free of control characters (``InvalidArgument`` naming the
field). Paths are built from these values further down only through ``host.paths.child``, so no request can
name a file outside the agent's roots. Validation that needs state is the service's. Every call is blocking
work: the servicer is synchronous and runs on the threaded server's threads (``rpc.server.new_threaded_server``);
errors cross the shared edge interceptor (one error boundary).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TypeVar

import grpc

from nvmeof_csi import __version__
from nvmeof_csi.agent.authz import NODE, caller
from nvmeof_csi.agent.messages import (
    own_hosts_only,
    portal_msg,
    reservation_msg,
    snapshot_msg,
    volume_msg,
    volume_with_health,
)
from nvmeof_csi.agent.names import MAX_AGENT_BYTES, Reservation
from nvmeof_csi.agent.parts import VolumeView
from nvmeof_csi.agent.replica_spec import ACTIONS, ReplicaSpec
from nvmeof_csi.agent.state import VolumeRecord
from nvmeof_csi.agent.target_agent import TargetAgent
from nvmeof_csi.errors import InvalidArgument, NotFound, PermissionDenied
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.gen import nvmeof_agent_pb2_grpc as pb_grpc
from nvmeof_csi.nvmeof.nqn import check_host_nqn, check_uuid
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.nvmeof.qos import mutable_only
from nvmeof_csi.rpc.calls import require
from nvmeof_csi.service.contracts import valid_node_name

Ctx = grpc.ServicerContext
MAX_NAME_BYTES = 256
DEFAULT_PAGE, MAX_PAGE = 500, 1000
T = TypeVar("T")
MAX_MAP_ENTRIES, MAX_KEY_BYTES, MAX_VALUE_BYTES = 64, 256, 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _name(value: str, field: str, limit: int = MAX_NAME_BYTES) -> str:
    require(value, field)
    if len(value.encode()) > limit or _CONTROL.search(value):
        raise InvalidArgument(f"{field} must be at most {limit} bytes without control characters")
    return value


def _node_name(value: str) -> str:
    if value and not valid_node_name(value):
        raise InvalidArgument(f"node_name {value[:80]!r} must be a Kubernetes Node name (a DNS subdomain)")
    return value


def _uuid(value: str, field: str) -> str:
    return check_uuid(value, field) if value else value


def _page_size(max_entries: int) -> int:
    if max_entries < 0:
        raise InvalidArgument("max_entries must not be negative")
    return min(max_entries or DEFAULT_PAGE, MAX_PAGE)


def _page(items: list[T], key: Callable[[T], str], max_entries: int, token: str) -> tuple[list[T], str]:
    """One page of ``items`` (sorted by ``key``, a UUID) after ``token``; the next token ("" at the end)."""
    size = _page_size(max_entries)
    after = _uuid(token, "starting_token")
    rest = [item for item in items if key(item) > after] if after else items
    page = rest[:size]
    return page, key(page[-1]) if len(rest) > size else ""


def _map(values: Mapping[str, str], field: str) -> dict[str, str]:
    if len(values) > MAX_MAP_ENTRIES:
        raise InvalidArgument(f"{field} has more than {MAX_MAP_ENTRIES} entries")
    for key, value in values.items():
        _name(key, f"{field} key", MAX_KEY_BYTES)
        if len(value.encode()) > MAX_VALUE_BYTES or "\x00" in value:
            raise InvalidArgument(f"{field}[{key!r}] must be at most {MAX_VALUE_BYTES} bytes without NUL")
    return dict(values)


#: The agent locks inside its service (per name, per volume), where it can wait (a create of a name at most
#: ``AgentParts.name_wait`` seconds for another: racing creates of one name are served one after the other, a
#: retry behind a long fill is ABORTED); the edge takes no keys.
AGENT_LOCK_TABLE: dict[str, tuple[str, ...]] = {}
#: Calls served at once (threads are made on demand). Health answers unless this many calls are in flight; long
#: dataset fills are bounded on their own (``datasets.fill.MAX_FILLS``; none free: RESOURCE_EXHAUSTED at once).
AGENT_RPC_THREADS = 128


class AgentServicer(pb_grpc.AgentServicer):
    def __init__(self, agent: TargetAgent, unknown: list[str]) -> None:
        self._agent = agent
        self._unknown = unknown

    def SetDraining(self, request: pb.SetDrainingRequest, context: Ctx) -> pb.HealthResponse:
        self._agent.drain.set(request.draining)
        return self.Health(pb.HealthRequest(), context)

    def Health(self, request: pb.HealthRequest, context: Ctx) -> pb.HealthResponse:
        ready, rep = self._agent.nvmet.available(), self._agent.replication
        message = "ready" if ready else f"nvmet configfs not available at {self._agent.nvmet.root}"
        return pb.HealthResponse(
            ready=ready,
            message=message,
            version=__version__,
            agent_name=self._agent.name,
            unknown_objects=self._unknown,
            replication_address=rep.address if rep is not None else "",
            replication_host=rep.host if rep is not None else "",
            draining=self._agent.drain.draining(),
        )

    def CreateVolume(self, request: pb.CreateVolumeRequest, context: Ctx) -> pb.Volume:
        name = _name(request.name, "name")
        source = request.source.WhichOneof("source") if request.HasField("source") else None
        source_volume = _uuid(request.source.volume_uuid, "source.volume_uuid") if source == "volume_uuid" else ""
        source_snap = _uuid(request.source.snapshot_uuid, "source.snapshot_uuid") if source == "snapshot_uuid" else ""
        view = self._agent.create_volume(
            name,
            request.capacity_bytes,
            VolumeParameters.parse(_map(request.parameters, "parameters")),  # parsed once, at the agent's edge
            _map(request.labels, "labels"),
            source_volume,
            source_snap,
            _uuid(request.uuid, "uuid"),
            ReplicaSpec.parse(_map(request.replica, "replica")) if request.replica else None,
        )
        return volume_msg(view)

    def ListFenceRequests(self, request: pb.ListFenceRequestsRequest, context: Ctx) -> pb.ListFenceRequestsResponse:
        found = []
        for r in self._agent.fence_requests():
            try:
                since = r.path.stat().st_mtime
            except FileNotFoundError:  # answered meanwhile
                continue
            vol = r.resource.removeprefix("nv-")
            rec = self._agent.state.current.volumes.get(vol)
            replica = rec.replica if rec is not None else {}
            found.append(
                pb.FenceRequest(
                    volume_uuid=vol,
                    pid=r.pid,
                    waiting_since=since,
                    role=replica.get("role", ""),
                    epoch=int(replica.get("epoch", "0")),
                )
            )
        return pb.ListFenceRequestsResponse(requests=found)

    def AnswerFenceRequest(self, request: pb.AnswerFenceRequestRequest, context: Ctx) -> pb.AnswerFenceRequestResponse:
        require(request.volume_uuid, "volume_uuid")
        if request.pid <= 0:
            raise InvalidArgument("pid must be the waiting helper's process ID")
        answered = self._agent.answer_fence(_uuid(request.volume_uuid, "volume_uuid"), request.pid, request.peer_fenced)
        return pb.AnswerFenceRequestResponse(answered=answered)

    def SetReplicaRole(self, request: pb.SetReplicaRoleRequest, context: Ctx) -> pb.Volume:
        require(request.uuid, "uuid")
        require(request.role, "role")
        if request.role not in ACTIONS or request.epoch < 0:
            raise InvalidArgument(f"role must be one of {', '.join(ACTIONS)} and epoch not negative")
        view = self._agent.set_replica_role(_uuid(request.uuid, "uuid"), request.role, request.epoch)
        return volume_msg(view, self._agent.replica_state(view.record))

    def ReserveName(self, request: pb.Reservation, context: Ctx) -> pb.Reservation:
        require(request.volume_uuid, "volume_uuid")
        wanted = Reservation(
            _name(request.name, "name"),
            _uuid(request.volume_uuid, "volume_uuid"),
            _name(request.agent, "agent", MAX_AGENT_BYTES),
        )
        return reservation_msg(self._agent.reserve_name(wanted))

    def LookupName(self, request: pb.LookupNameRequest, context: Ctx) -> pb.Reservation:
        name = _name(request.name, "name")
        kept = self._agent.lookup_name(name)
        if kept is None:
            raise NotFound(f"name {name!r} is neither reserved nor used on agent {self._agent.name}")
        return reservation_msg(kept)

    def ReleaseName(self, request: pb.ReleaseNameRequest, context: Ctx) -> pb.ReleaseNameResponse:
        require(request.volume_uuid, "volume_uuid")
        self._agent.release_name(_name(request.name, "name"), _uuid(request.volume_uuid, "volume_uuid"))
        return pb.ReleaseNameResponse()

    def DeleteVolume(self, request: pb.DeleteVolumeRequest, context: Ctx) -> pb.DeleteVolumeResponse:
        require(request.uuid, "uuid")
        self._agent.delete_volume(_uuid(request.uuid, "uuid"))
        return pb.DeleteVolumeResponse()

    def ResizeVolume(self, request: pb.ResizeVolumeRequest, context: Ctx) -> pb.Volume:
        require(request.uuid, "uuid")
        view = self._agent.resize_volume(_uuid(request.uuid, "uuid"), request.capacity_bytes)
        return volume_msg(view)

    def ModifyVolume(self, request: pb.ModifyVolumeRequest, context: Ctx) -> pb.Volume:
        require(request.uuid, "uuid")
        changes = _map(request.parameters, "parameters")
        mutable_only(changes)
        view = self._agent.modify_volume(_uuid(request.uuid, "uuid"), changes)
        return volume_msg(view)

    @staticmethod
    def _visible(view: VolumeView) -> bool:
        """A node sees only the volumes that allow its own host NQN; every other role sees all."""
        return AgentServicer._visible_record(view.record)

    @staticmethod
    def _visible_record(record: VolumeRecord) -> bool:
        who = caller()
        return who.role != NODE or (who.host_nqn in record.hosts and who.holds(who.host_nqn, record.host_nodes))

    def GetVolume(self, request: pb.GetVolumeRequest, context: Ctx) -> pb.Volume:
        key = request.WhichOneof("key")
        require(key, "uuid or name")
        uuid, name = _uuid(request.uuid, "uuid"), _name(request.name, "name") if request.name else ""
        hidden = NotFound(f"volume {uuid or name!r} does not exist on agent {self._agent.name}")
        try:
            view = self._agent.get_volume(uuid, name)
        except NotFound as exc:  # a node learns nothing from the message: absent and not its own read the same
            raise (hidden if caller().role == NODE else exc) from None
        if not self._visible(view):
            raise hidden
        return own_hosts_only(volume_with_health(self._agent, view))

    def ListVolumes(self, request: pb.ListVolumesRequest, context: Ctx) -> pb.ListVolumesResponse:
        page, token = self._agent.list_volume_page(
            _uuid(request.starting_token, "starting_token"), _page_size(request.max_entries), self._visible_record
        )
        return pb.ListVolumesResponse(volumes=[own_hosts_only(volume_msg(v)) for v in page], next_token=token)

    def CreateSnapshot(self, request: pb.CreateSnapshotRequest, context: Ctx) -> pb.Snapshot:
        require(request.source_volume_uuid, "source_volume_uuid")
        name, source = _name(request.name, "name"), _uuid(request.source_volume_uuid, "source_volume_uuid")
        return snapshot_msg(self._agent.create_snapshot(name, source))

    def DeleteSnapshot(self, request: pb.DeleteSnapshotRequest, context: Ctx) -> pb.DeleteSnapshotResponse:
        require(request.uuid, "uuid")
        self._agent.delete_snapshot(_uuid(request.uuid, "uuid"))
        return pb.DeleteSnapshotResponse()

    def ListSnapshots(self, request: pb.ListSnapshotsRequest, context: Ctx) -> pb.ListSnapshotsResponse:
        source = _uuid(request.source_volume_uuid, "source_volume_uuid")
        snaps = self._agent.list_snapshots(source, _uuid(request.snapshot_uuid, "snapshot_uuid"))
        page, token = _page(snaps, lambda s: s.uuid, request.max_entries, request.starting_token)
        return pb.ListSnapshotsResponse(snapshots=[snapshot_msg(s) for s in page], next_token=token)

    def AllowHost(self, request: pb.AllowHostRequest, context: Ctx) -> pb.Volume:
        require(request.volume_uuid, "volume_uuid")
        require(request.host_nqn, "host_nqn")
        check_host_nqn(request.host_nqn)
        view = self._agent.allow_host(
            _uuid(request.volume_uuid, "volume_uuid"),
            request.host_nqn,
            request.dhchap_secret,
            request.readonly,
            request.dhchap_ctrl_secret,
            _node_name(request.node_name),
        )
        return volume_msg(view)

    def GetHostKeys(self, request: pb.GetHostKeysRequest, context: Ctx) -> pb.HostKeys:
        require(request.volume_uuid, "volume_uuid")
        require(request.host_nqn, "host_nqn")
        check_host_nqn(request.host_nqn)
        who = caller()
        if who.role == NODE and who.host_nqn != request.host_nqn:
            raise PermissionDenied(
                f"client {who.identity!r} may fetch the keys of its own host ({who.host_nqn}) only, "
                f"not of {request.host_nqn}"
            )
        vol_uuid = _uuid(request.volume_uuid, "volume_uuid")
        if who.role == NODE and not self._visible(self._agent.get_volume(vol_uuid, "")):
            raise NotFound(f"host {request.host_nqn} is not allowed on volume {vol_uuid}")
        key, ctrl_key, psk = self._agent.host_keys(vol_uuid, request.host_nqn)
        return pb.HostKeys(dhchap_secret=key, dhchap_ctrl_secret=ctrl_key, tls_psk=psk)

    def RotateHostKey(self, request: pb.RotateHostKeyRequest, context: Ctx) -> pb.RotateHostKeyResponse:
        require(request.host_nqn, "host_nqn")
        check_host_nqn(request.host_nqn)
        done = self._agent.rotate_host_key(request.host_nqn, request.controller_key)
        return pb.RotateHostKeyResponse(volume_uuids=done)

    def DenyHost(self, request: pb.DenyHostRequest, context: Ctx) -> pb.Volume:
        require(request.volume_uuid, "volume_uuid")
        require(request.host_nqn, "host_nqn")
        check_host_nqn(request.host_nqn)
        return volume_msg(self._agent.deny_host(_uuid(request.volume_uuid, "volume_uuid"), request.host_nqn))

    def FenceHost(self, request: pb.FenceHostRequest, context: Ctx) -> pb.Volume:
        require(request.volume_uuid, "volume_uuid")
        require(request.host_nqn, "host_nqn")
        require(request.reason, "reason")
        check_host_nqn(request.host_nqn)
        vol_uuid = _uuid(request.volume_uuid, "volume_uuid")
        return volume_msg(self._agent.fence_host(vol_uuid, request.host_nqn, request.reason, request.boot_id))

    def UnfenceHost(self, request: pb.UnfenceHostRequest, context: Ctx) -> pb.Volume:
        require(request.volume_uuid, "volume_uuid")
        require(request.host_nqn, "host_nqn")
        check_host_nqn(request.host_nqn)
        return volume_msg(self._agent.unfence_host(_uuid(request.volume_uuid, "volume_uuid"), request.host_nqn))

    def ListPortals(self, request: pb.ListPortalsRequest, context: Ctx) -> pb.ListPortalsResponse:
        portals = self._agent.list_portals()
        return pb.ListPortalsResponse(portals=[portal_msg(p, s) for p, s in portals])

    def SetAnaState(self, request: pb.SetAnaStateRequest, context: Ctx) -> pb.ListPortalsResponse:
        group, state = _name(request.group, "group", 64), _name(request.state, "state", 64)
        portals = self._agent.set_ana(group, state)
        return pb.ListPortalsResponse(portals=[portal_msg(p, s) for p, s in portals])

    def GetCapacity(self, request: pb.GetCapacityRequest, context: Ctx) -> pb.GetCapacityResponse:
        usage = self._agent.store.usage()
        total = self._agent.capacity_bytes()
        provisioned = self._agent.provisioned_bytes()
        room = usage.used_bytes + usage.free_bytes
        reserve = int(room * (100.0 - self._agent.high_water) / 100.0)  # kept for the volumes that exist
        pool = pb.Pool(
            name=str(self._agent.store.pool),
            total_bytes=total,
            free_bytes=max(0, min(total - provisioned, usage.free_bytes - reserve)),
            provisioned_bytes=provisioned,
        )
        return pb.GetCapacityResponse(pools=[pool])
