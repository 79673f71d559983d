"""A typed, synchronous client of one target agent (used by nvmeofctl and the controller).

Contract: every call has a timeout; a gRPC failure is raised as the matching ``nvmeof_csi.errors`` class
(UNAVAILABLE -> ``Unavailable`` ...), with the agent's name in the message (for a client made with
``retry_unavailable``, after gRPC's own retries: ``RETRY_POLICY``). TCP needs mutual TLS, except on a
loopback address when plaintext is explicitly allowed. Thread-safe (one channel, many calls).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from nvmeof_csi.errors import ConfigError, NotFound, error_for
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.gen import nvmeof_agent_pb2_grpc as pb_grpc
from nvmeof_csi.rpc.endpoints import Endpoint, TlsFiles, is_loopback

T = TypeVar("T")
#: With ``retry_unavailable``: a call that found the agent UNAVAILABLE (a connection its restart or reboot broke:
#: "Stream removed", reset by peer) is tried again by gRPC itself, at most 4 times within the call's deadline. Safe
#: because every agent RPC is idempotent (creates by name and reserved UUID, the rest by UUID).
RETRY_POLICY = {
    "methodConfig": [{
        "name": [{"service": "nvmeof.agent.v1.Agent"}],
        "retryPolicy": {
            "maxAttempts": 4, "initialBackoff": "0.5s", "maxBackoff": "4s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]
}  # fmt: skip
#: Reconnect quickly after an agent restarts (gRPC's default backoff grows to two minutes).
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 4000),
)
RETRYING = (("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(RETRY_POLICY)))


@dataclass(frozen=True)
class AgentTarget:
    """How to reach one agent."""

    name: str
    endpoint: Endpoint
    tls: TlsFiles | None = None
    allow_plaintext_loopback: bool = False

    def __post_init__(self) -> None:
        plaintext_ok = self.allow_plaintext_loopback and is_loopback(self.endpoint.host)
        if self.endpoint.scheme == "tcp" and self.tls is None and not plaintext_ok:
            raise ConfigError(f"agent {self.name}: TCP needs mutual TLS (plaintext only on loopback, if allowed)")


class AgentClient:
    def __init__(self, target: AgentTarget, timeout: float = 30.0, retry_unavailable: bool = False) -> None:
        """``retry_unavailable``: gRPC retries calls that found the agent unavailable (the controller's choice;
        an operator's tool reports at once)."""
        self.target = target
        self.timeout = timeout
        address = target.endpoint.grpc_address
        options = (*CHANNEL_OPTIONS, *(RETRYING if retry_unavailable else ()))
        if target.tls is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=target.tls.ca.read_bytes(),
                private_key=target.tls.key.read_bytes(),
                certificate_chain=target.tls.cert.read_bytes(),
            )
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.AgentStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        try:
            return method(request, timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            details = err.details() if hasattr(err, "details") else str(err)
            raise error_for(code, f"agent {self.target.name}: {details}") from err

    def health(self) -> pb.HealthResponse:
        return self._call(self._stub.Health, pb.HealthRequest())

    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        source_volume: str = "",
        source_snapshot: str = "",
        timeout: float | None = None,
        vol_uuid: str = "",
        replica: Mapping[str, str] | None = None,
    ) -> pb.Volume:
        """Create (idempotent by name; ``vol_uuid``: the UUID the name's reservation holds). ``timeout``
        overrides the client's default: filling a dataset volume can take much longer than an ordinary create.
        ``replica``: this agent's side of a replicated volume's pair (``agent/replica_spec.py``)."""
        source = None
        if source_volume:
            source = pb.VolumeSource(volume_uuid=source_volume)
        elif source_snapshot:
            source = pb.VolumeSource(snapshot_uuid=source_snapshot)
        request = pb.CreateVolumeRequest(
            name=name,
            capacity_bytes=capacity_bytes,
            parameters=dict(parameters or {}),
            labels=dict(labels or {}),
            source=source,
            uuid=vol_uuid,
            replica=dict(replica or {}),
        )
        return self._call(self._stub.CreateVolume, request, timeout)

    def set_replica_role(self, vol_uuid: str, role: str, epoch: int, timeout: float | None = None) -> pb.Volume:
        """A replica's new role (a promotion may wait for DRBD's fence-peer call to be answered: ``timeout``)."""
        request = pb.SetReplicaRoleRequest(uuid=vol_uuid, role=role, epoch=epoch)
        return self._call(self._stub.SetReplicaRole, request, timeout)

    def set_draining(self, draining: bool) -> pb.HealthResponse:
        """Mark the agent's node draining (its replicated volumes move to their peers) or not; its Health."""
        return self._call(self._stub.SetDraining, pb.SetDrainingRequest(draining=draining))

    def fence_requests(self) -> list[pb.FenceRequest]:
        return list(self._call(self._stub.ListFenceRequests, pb.ListFenceRequestsRequest()).requests)

    def answer_fence(self, vol_uuid: str, pid: int, peer_fenced: bool) -> bool:
        request = pb.AnswerFenceRequestRequest(volume_uuid=vol_uuid, pid=pid, peer_fenced=peer_fenced)
        return self._call(self._stub.AnswerFenceRequest, request).answered

    def delete_volume(self, vol_uuid: str) -> None:
        self._call(self._stub.DeleteVolume, pb.DeleteVolumeRequest(uuid=vol_uuid))

    def resize_volume(self, vol_uuid: str, capacity_bytes: int) -> pb.Volume:
        return self._call(self._stub.ResizeVolume, pb.ResizeVolumeRequest(uuid=vol_uuid, capacity_bytes=capacity_bytes))

    def modify_volume(self, vol_uuid: str, parameters: Mapping[str, str]) -> pb.Volume:
        return self._call(self._stub.ModifyVolume, pb.ModifyVolumeRequest(uuid=vol_uuid, parameters=dict(parameters)))

    def get_volume(self, vol_uuid: str = "", name: str = "") -> pb.Volume:
        """By UUID, or by name."""
        request = pb.GetVolumeRequest(name=name) if name else pb.GetVolumeRequest(uuid=vol_uuid)
        return self._call(self._stub.GetVolume, request)

    def reserve_name(self, name: str, vol_uuid: str, agent: str) -> pb.Reservation:
        """The reservation kept for ``name``: this one, or the one kept before (see ``ReserveName``)."""
        return self._call(self._stub.ReserveName, pb.Reservation(name=name, volume_uuid=vol_uuid, agent=agent))

    def lookup_name(self, name: str) -> pb.Reservation | None:
        """What this agent knows of ``name`` (see ``LookupName``); ``None`` when nothing."""
        try:
            return self._call(self._stub.LookupName, pb.LookupNameRequest(name=name))
        except NotFound:
            return None

    def release_name(self, name: str, vol_uuid: str) -> None:
        self._call(self._stub.ReleaseName, pb.ReleaseNameRequest(name=name, volume_uuid=vol_uuid))

    def list_page(self, request: pb.ListVolumesRequest) -> pb.ListVolumesResponse:
        """One ListVolumes page, as asked."""
        return self._call(self._stub.ListVolumes, request)

    def list_volumes(self) -> list[pb.Volume]:
        """Every volume (all pages)."""
        found: list[pb.Volume] = []
        token = ""
        while True:
            reply = self._call(self._stub.ListVolumes, pb.ListVolumesRequest(starting_token=token))
            found += reply.volumes
            token = reply.next_token
            if not token:
                return found

    def create_snapshot(self, name: str, source_volume: str) -> pb.Snapshot:
        request = pb.CreateSnapshotRequest(name=name, source_volume_uuid=source_volume)
        return self._call(self._stub.CreateSnapshot, request)

    def delete_snapshot(self, snap_uuid: str) -> None:
        self._call(self._stub.DeleteSnapshot, pb.DeleteSnapshotRequest(uuid=snap_uuid))

    def list_snapshots(self, source_volume: str = "", snapshot_uuid: str = "") -> list[pb.Snapshot]:
        found: list[pb.Snapshot] = []
        token = ""
        while True:
            request = pb.ListSnapshotsRequest(
                source_volume_uuid=source_volume, snapshot_uuid=snapshot_uuid, starting_token=token
            )
            reply = self._call(self._stub.ListSnapshots, request)
            found += reply.snapshots
            token = reply.next_token
            if not token:
                return found

    def allow_host(
        self,
        vol_uuid: str,
        host_nqn: str,
        secret: str = "",
        readonly: bool = False,
        ctrl_secret: str = "",
        node_name: str = "",
    ) -> pb.Volume:
        request = pb.AllowHostRequest(
            volume_uuid=vol_uuid,
            host_nqn=host_nqn,
            dhchap_secret=secret,
            readonly=readonly,
            dhchap_ctrl_secret=ctrl_secret,
            node_name=node_name,
        )
        return self._call(self._stub.AllowHost, request)

    def get_host_keys(self, vol_uuid: str, host_nqn: str) -> pb.HostKeys:
        return self._call(self._stub.GetHostKeys, pb.GetHostKeysRequest(volume_uuid=vol_uuid, host_nqn=host_nqn))

    def rotate_host_key(self, host_nqn: str, controller_key: bool = False) -> list[str]:
        request = pb.RotateHostKeyRequest(host_nqn=host_nqn, controller_key=controller_key)
        return list(self._call(self._stub.RotateHostKey, request).volume_uuids)

    def deny_host(self, vol_uuid: str, host_nqn: str) -> pb.Volume:
        return self._call(self._stub.DenyHost, pb.DenyHostRequest(volume_uuid=vol_uuid, host_nqn=host_nqn))

    def fence_host(self, vol_uuid: str, host_nqn: str, reason: str, boot_id: str = "") -> pb.Volume:
        request = pb.FenceHostRequest(volume_uuid=vol_uuid, host_nqn=host_nqn, reason=reason, boot_id=boot_id)
        return self._call(self._stub.FenceHost, request)

    def unfence_host(self, vol_uuid: str, host_nqn: str) -> pb.Volume:
        return self._call(self._stub.UnfenceHost, pb.UnfenceHostRequest(volume_uuid=vol_uuid, host_nqn=host_nqn))

    def list_portals(self) -> list[pb.Portal]:
        return list(self._call(self._stub.ListPortals, pb.ListPortalsRequest()).portals)

    def set_ana(self, group: str, state: str) -> list[pb.Portal]:
        return list(self._call(self._stub.SetAnaState, pb.SetAnaStateRequest(group=group, state=state)).portals)

    def capacity(self) -> list[pb.Pool]:
        return list(self._call(self._stub.GetCapacity, pb.GetCapacityRequest()).pools)
