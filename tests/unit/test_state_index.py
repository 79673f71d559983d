"""The figures a create asks for (bytes provisioned, volumes by name), kept by the state store from the records
each commit changed, agree with the same figures computed afresh from the current state, whatever the sequence
of commits."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nvmeof_csi.agent.state import DELETING, SnapshotRecord, StateStore, VolumeRecord
from nvmeof_csi.agent.state_index import StateIndex

UUIDS = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(6)]
op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(UUIDS), st.sampled_from(["a", "b", "c"]), st.integers(1, 9)),
    st.tuples(st.just("deleting"), st.sampled_from(UUIDS), st.just(""), st.just(0)),
    st.tuples(st.just("drop"), st.sampled_from(UUIDS), st.just(""), st.just(0)),
    st.tuples(st.just("snap"), st.sampled_from(UUIDS), st.just(""), st.integers(1, 9)),
    st.tuples(st.just("unsnap"), st.sampled_from(UUIDS), st.just(""), st.just(0)),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(op, max_size=25))
def test_carried_figures_equal_fresh_ones(ops: list[tuple[str, str, str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp))
        for kind, uuid, name, size in ops:
            current = store.current.volumes.get(uuid)
            if kind == "put":
                store.put_volume(VolumeRecord(uuid, name, size << 20))
            elif kind == "deleting" and current is not None:
                store.put_volume(current.evolve(status=DELETING))
            elif kind == "drop":
                store.drop_volume(uuid)
            elif kind == "snap":
                store.put_snapshot(SnapshotRecord(uuid, f"s-{uuid}", UUIDS[0], size << 20))
            elif kind == "unsnap":
                store.drop_snapshot(uuid)
            afresh = StateIndex(store.current)  # walks the whole state
            assert store.provisioned_bytes() == afresh.provisioned
            for each in ("a", "b", "c"):
                assert store.named_volumes(each) == afresh.named(store.current, each)
