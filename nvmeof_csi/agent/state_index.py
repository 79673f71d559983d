"""Figures of the agent's state that every create asks for — the bytes provisioned and the volumes called by a
name — kept up to date by the records each commit changed, so a create costs the same with 10 or 10,000 volumes.

Contract: :class:`StateIndex` is owned by a :class:`~nvmeof_csi.agent.state.StateStore`, which calls
:meth:`StateIndex.apply` under its lock with every state it makes current (never walking the whole state after the
first), so :meth:`StateIndex.provisioned` and :meth:`StateIndex.named` agree with the current state at all times.
Not thread-safe on its own: the store's lock guards it.
"""

from __future__ import annotations

from collections.abc import Iterable

from nvmeof_csi.agent.state_model import AgentState, SnapshotRecord, VolumeRecord


def _size(rec: VolumeRecord | SnapshotRecord | None) -> int:
    if rec is None:
        return 0
    return rec.size_bytes if hasattr(rec, "size_bytes") else rec.capacity_bytes


class StateIndex:
    def __init__(self, state: AgentState) -> None:
        """The figures of ``state``, walked once."""
        self.provisioned = sum(v.capacity_bytes for v in state.volumes.values()) + sum(
            s.size_bytes for s in state.snapshots.values()
        )
        self._names: dict[str, set[str]] = {}
        for rec in state.volumes.values():
            self._names.setdefault(rec.name, set()).add(rec.uuid)

    def apply(self, before: AgentState, after: AgentState, changed: Iterable[tuple[str, str]]) -> None:
        """``after`` became current in place of ``before``; ``changed``: the (kind, UUID) pairs that differ."""
        for kind, uuid in changed:
            old, new = getattr(before, kind).get(uuid), getattr(after, kind).get(uuid)
            self.provisioned += _size(new) - _size(old)
            if kind != "volumes":
                continue
            if old is not None:
                uuids = self._names.get(old.name, set())
                uuids.discard(uuid)
                if not uuids:
                    self._names.pop(old.name, None)
            if new is not None:
                self._names.setdefault(new.name, set()).add(uuid)

    def named(self, state: AgentState, name: str) -> list[VolumeRecord]:
        """The volumes (any status) of ``state`` called ``name``, in UUID order (``state``: the current one)."""
        return [state.volumes[u] for u in sorted(self._names.get(name, ())) if u in state.volumes]
