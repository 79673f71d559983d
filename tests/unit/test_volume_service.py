import pytest

from nvmeof_csi.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
)
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import StaticNodes, VolumeRef
from nvmeof_csi.service.provisioning import CapacityRange, GiB, MiB, VolumeService, choose_size
from tests.support.fakes import FakeBackend


def svc(capacity: int = 100 * GiB, max_per_node: int = 0) -> tuple[VolumeService, FakeBackend]:
    backend = FakeBackend(capacity)
    return VolumeService(backend, StaticNodes(frozenset({"n1", "n2"})), max_per_node), backend


@pytest.mark.parametrize(
    ("required", "limit", "size"),
    [(0, 0, GiB), (1, 0, MiB), (MiB + 1, 0, 2 * MiB), (0, 10 * MiB, 10 * MiB), (5 * MiB + 3, 5 * MiB + 7, 5 * MiB + 7)],
)
def test_choose_size(required: int, limit: int, size: int) -> None:
    assert choose_size(CapacityRange(required, limit), 100 * GiB) == size


@pytest.mark.parametrize(
    ("required", "limit", "error"),
    [(-1, 0, InvalidArgument), (0, -1, InvalidArgument), (10, 5, InvalidArgument), (200 * GiB, 0, OutOfRange)],
)
def test_choose_size_rejects(required: int, limit: int, error: type[Exception]) -> None:
    with pytest.raises(error):
        choose_size(CapacityRange(required, limit), 100 * GiB)


def test_create_is_idempotent_by_name_and_checks_compatibility() -> None:
    s, backend = svc()
    a = s.create("pvc-1", CapacityRange(GiB), VolumeParameters.parse({"queueSize": "64"}))
    b = s.create("pvc-1", CapacityRange(GiB), VolumeParameters.parse({"queueSize": "64"}))
    assert a == b and len(backend.volumes) == 1
    with pytest.raises(AlreadyExists, match="outside the requested range"):
        s.create("pvc-1", CapacityRange(2 * GiB), VolumeParameters.parse({"queueSize": "64"}))
    with pytest.raises(AlreadyExists, match="different parameters"):
        s.create("pvc-1", CapacityRange(GiB), VolumeParameters.parse({"queueSize": "128"}))


def test_capacity_exhausted() -> None:
    s, _ = svc(capacity=3 * GiB)
    s.create("a", CapacityRange(2 * GiB), VolumeParameters.parse({}))
    with pytest.raises(ResourceExhausted):
        s.create("b", CapacityRange(2 * GiB), VolumeParameters.parse({}))


def test_publish_checks_volume_node_and_limit() -> None:
    s, _ = svc(max_per_node=1)
    a = s.create("a", CapacityRange(GiB), VolumeParameters.parse({}))
    b = s.create("b", CapacityRange(GiB), VolumeParameters.parse({}))
    with pytest.raises(NotFound, match="node"):
        s.publish(a.ref, "ghost", False)
    with pytest.raises(NotFound, match="volume"):
        s.publish(VolumeRef("fake", "00000000-0000-0000-0000-000000000000"), "n1", False)
    s.publish(a.ref, "n1", False)
    s.publish(a.ref, "n1", False)  # repeat is fine, does not count twice
    with pytest.raises(ResourceExhausted, match="limit 1"):
        s.publish(b.ref, "n1", False)
    s.publish(b.ref, "n2", False)
    s.unpublish(a.ref, "n1")
    s.unpublish(a.ref, "n1")
    s.publish(b.ref, "n1", False)


def test_a_one_node_volume_is_refused_to_a_second_node_until_the_first_lets_go() -> None:
    """CSI: FAILED_PRECONDITION when a volume without a MULTI_NODE mode is published at another node."""
    s, _ = svc()
    a = s.create("a", CapacityRange(GiB), VolumeParameters.parse({}))
    s.publish(a.ref, "n1", False, one_node=True)
    s.publish(a.ref, "n1", False, one_node=True)  # the same node again: fine
    with pytest.raises(FailedPrecondition, match="published to node 'n1'"):
        s.publish(a.ref, "n2", False, one_node=True)
    s.publish(a.ref, "n2", True)  # a multi-node mode shares it
    s.unpublish(a.ref, "n1")
    s.unpublish(a.ref, "n2")
    s.publish(a.ref, "n2", False, one_node=True)  # let go: now it may move


def test_pagination_survives_deleting_the_last_entry_of_a_page() -> None:
    s, _ = svc()
    names = [f"v{i}" for i in range(7)]
    for n in names:
        s.create(n, CapacityRange(MiB), VolumeParameters.parse({}))
    first = s.list(3, "")
    assert len(first.volumes) == 3 and first.next_token
    s.delete(first.volumes[-1].ref)
    seen = {v.name for v in first.volumes}
    token = first.next_token
    while token:
        page = s.list(3, token)
        seen |= {v.name for v in page.volumes}
        token = page.next_token
    assert seen == set(names)
    assert len(s.list(0, "").volumes) == 6


def test_list_bad_token_is_aborted() -> None:
    s, _ = svc()
    with pytest.raises(Aborted, match="starting_token"):
        s.list(1, "garbage")
    with pytest.raises(InvalidArgument):
        s.list(-1, "")


def test_expand_grows_never_shrinks() -> None:
    s, _ = svc()
    v = s.create("a", CapacityRange(GiB), VolumeParameters.parse({}))
    assert s.expand(v.ref, CapacityRange(GiB // 2)) == GiB
    assert s.expand(v.ref, CapacityRange(2 * GiB + 1)) == 2 * GiB + MiB
    with pytest.raises(NotFound):
        s.expand(VolumeRef("fake", "00000000-0000-0000-0000-000000000000"), CapacityRange(GiB))
