"""What the controller's agent backend needs of one target agent (:class:`AgentApi`, implemented by the
agent's gRPC client and by in-process fakes in tests), and which node IDs it may publish to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from nvmeof_csi.agentclient.client import AgentClient, AgentTarget
from nvmeof_csi.gen import nvmeof_agent_pb2 as pb
from nvmeof_csi.nvmeof.nqn import valid_host_nqn
from nvmeof_csi.topology.fabric_map import AgentEntry


class AgentApi(Protocol):
    """The part of :class:`AgentClient` the backend uses (fakes implement it in tests)."""

    def health(self) -> pb.HealthResponse: ...
    def create_volume(
        self,
        name: str,
        capacity_bytes: int,
        parameters: Mapping[str, str] | None = ...,
        labels: Mapping[str, str] | None = ...,
        source_volume: str = ...,
        source_snapshot: str = ...,
        timeout: float | None = ...,
        vol_uuid: str = ...,
        replica: Mapping[str, str] | None = ...,
    ) -> pb.Volume: ...
    def set_replica_role(self, vol_uuid: str, role: str, epoch: int, timeout: float | None = ...) -> pb.Volume: ...
    def delete_volume(self, vol_uuid: str) -> None: ...
    def resize_volume(self, vol_uuid: str, capacity_bytes: int) -> pb.Volume: ...
    def modify_volume(self, vol_uuid: str, parameters: Mapping[str, str]) -> pb.Volume: ...
    def get_volume(self, vol_uuid: str = ..., name: str = ...) -> pb.Volume: ...
    def reserve_name(self, name: str, vol_uuid: str, agent: str) -> pb.Reservation: ...
    def lookup_name(self, name: str) -> pb.Reservation | None: ...
    def release_name(self, name: str, vol_uuid: str) -> None: ...
    def list_volumes(self) -> list[pb.Volume]: ...
    def create_snapshot(self, name: str, source_volume: str) -> pb.Snapshot: ...
    def delete_snapshot(self, snap_uuid: str) -> None: ...
    def list_snapshots(self, source_volume: str = ..., snapshot_uuid: str = ...) -> list[pb.Snapshot]: ...
    def allow_host(
        self,
        vol_uuid: str,
        host_nqn: str,
        secret: str = ...,
        readonly: bool = ...,
        ctrl_secret: str = ...,
        node_name: str = ...,
    ) -> pb.Volume: ...
    def get_host_keys(self, vol_uuid: str, host_nqn: str) -> pb.HostKeys: ...
    def deny_host(self, vol_uuid: str, host_nqn: str) -> pb.Volume: ...
    def fence_host(self, vol_uuid: str, host_nqn: str, reason: str, boot_id: str = ...) -> pb.Volume: ...
    def unfence_host(self, vol_uuid: str, host_nqn: str) -> pb.Volume: ...
    def capacity(self) -> list[pb.Pool]: ...


class ReplicaApi(Protocol):
    """The part of :class:`AgentClient` the controller's arbiter uses for replicated volumes."""

    def set_replica_role(self, vol_uuid: str, role: str, epoch: int, timeout: float | None = ...) -> pb.Volume: ...
    def health(self) -> pb.HealthResponse: ...
    def get_volume(self, vol_uuid: str = ..., name: str = ...) -> pb.Volume: ...
    def fence_requests(self) -> list[pb.FenceRequest]: ...
    def answer_fence(self, vol_uuid: str, pid: int, peer_fenced: bool) -> bool: ...


def _retrying(entry: AgentEntry) -> AgentClient:
    target = AgentTarget(entry.name, entry.endpoint, entry.tls, entry.allow_plaintext_loopback)
    return AgentClient(target, retry_unavailable=True)


def default_client(entry: AgentEntry) -> AgentApi:
    """The controller's client of an agent: a call that meets a connection the agent's restart broke is retried."""
    return _retrying(entry)


def replica_client(entry: AgentEntry) -> ReplicaApi:
    """The arbiter's client of an agent (retried as :func:`default_client`'s)."""
    return _retrying(entry)


class HostNqnNodes:
    """NodeDirectory for the agent backend: every node ID that is a host NQN may be published to."""

    def knows(self, node_id: str) -> bool:
        return valid_host_nqn(node_id)
