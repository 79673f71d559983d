"""Where the arbiter's record of each replicated volume lives (``service/arbiter.py``): one
``coordination.k8s.io`` Lease per volume in the driver's namespace, named ``nvmeof-csi-replica-<volume uuid>``,
its holder the primary agent and the rest in annotations. Every change is a compare-and-swap on the Lease's
resourceVersion: two controller replicas, or a retry after a crash, never both decide.

Contract: :meth:`ReplicaRecords.read` returns the record and its version (``None`` when the volume has none; a
Lease whose annotations cannot be read raises ``FailedPrecondition`` naming it: the volume waits for an operator
rather than a guess). :meth:`ReplicaRecords.create` makes the first record (``AlreadyExists`` when one is there);
:meth:`ReplicaRecords.replace` writes a decided record over the version it was decided on and returns ``False``
when another writer came first (decide again on a fresh read); :meth:`ReplicaRecords.volumes` lists the volumes
that have one. The API being unreachable raises
``Unavailable``. :meth:`ReplicaRecords.delete` removes the record; absent is success.
"""

from __future__ import annotations

import json
from typing import Any

from nvmeof_csi.errors import AlreadyExists, FailedPrecondition, Unavailable
from nvmeof_csi.kube.api import api_error
from nvmeof_csi.nvmeof.nqn import check_uuid
from nvmeof_csi.service.arbiter import ReplicaRecord

PREFIX = "nvmeof-csi-replica-"
_KEY = "replica.csi.nvmeof.io/"


def _annotations(record: ReplicaRecord) -> dict[str, str]:
    return {
        _KEY + "replicas": json.dumps(list(record.replicas)),
        _KEY + "epoch": str(record.epoch),
        _KEY + "since": str(record.since),
        _KEY + "outdated": json.dumps(sorted(record.outdated)),
    }


def _record(name: str, holder: str, annotations: dict[str, str]) -> ReplicaRecord:
    try:
        replicas = json.loads(annotations[_KEY + "replicas"])
        outdated = json.loads(annotations[_KEY + "outdated"])
        record = ReplicaRecord(
            (str(replicas[0]), str(replicas[1])),
            primary=holder,
            epoch=int(annotations[_KEY + "epoch"]),
            since=int(annotations[_KEY + "since"]),
            outdated=frozenset(str(o) for o in outdated),
        )
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise FailedPrecondition(
            f"replica record {name} cannot be read ({type(exc).__name__}): fix or remove it"
        ) from exc
    if len(replicas) != 2 or holder not in record.replicas or not record.outdated <= set(record.replicas):
        raise FailedPrecondition(f"replica record {name} names a primary or replicas that do not fit together")
    return record


class ReplicaRecords:
    def __init__(self, coordination: Any, namespace: str) -> None:
        """``coordination``: ``kubernetes.client.CoordinationV1Api`` (or a stand-in)."""
        self._api, self._namespace = coordination, namespace

    def _name(self, vol_uuid: str) -> str:
        return PREFIX + check_uuid(vol_uuid, "volume UUID")

    def _body(self, name: str, record: ReplicaRecord, version: str = "") -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "namespace": self._namespace, "annotations": _annotations(record)}
        if version:
            metadata["resourceVersion"] = version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": {"holderIdentity": record.primary}}  # fmt: skip

    def read(self, vol_uuid: str) -> tuple[ReplicaRecord, str] | None:
        name = self._name(vol_uuid)
        try:
            lease = self._api.read_namespaced_lease(name, self._namespace, _request_timeout=10)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise Unavailable(f"cannot read replica record {name}: {api_error(exc)}") from exc
        holder = str(getattr(lease.spec, "holder_identity", "") or "")
        record = _record(name, holder, dict(lease.metadata.annotations or {}))
        return record, str(lease.metadata.resource_version or "")

    def create(self, vol_uuid: str, record: ReplicaRecord) -> None:
        name = self._name(vol_uuid)
        try:
            self._api.create_namespaced_lease(self._namespace, self._body(name, record), _request_timeout=10)
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                raise AlreadyExists(f"replica record {name} exists already") from exc
            raise Unavailable(f"cannot create replica record {name}: {api_error(exc)}") from exc

    def replace(self, vol_uuid: str, record: ReplicaRecord, version: str) -> bool:
        name = self._name(vol_uuid)
        try:
            self._api.replace_namespaced_lease(
                name, self._namespace, self._body(name, record, version), _request_timeout=10
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                return False
            raise Unavailable(f"cannot write replica record {name}: {api_error(exc)}") from exc
        return True

    def volumes(self) -> list[str]:
        """The UUIDs of every volume with a record (``Unavailable`` when the API cannot be reached)."""
        try:
            leases = self._api.list_namespaced_lease(self._namespace, _request_timeout=10)
        except Exception as exc:
            raise Unavailable(f"cannot list replica records: {api_error(exc)}") from exc
        names = (str(item.metadata.name) for item in leases.items)
        return sorted(name.removeprefix(PREFIX) for name in names if name.startswith(PREFIX))

    def delete(self, vol_uuid: str) -> None:
        name = self._name(vol_uuid)
        try:
            self._api.delete_namespaced_lease(name, self._namespace, _request_timeout=10)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise Unavailable(f"cannot delete replica record {name}: {api_error(exc)}") from exc
