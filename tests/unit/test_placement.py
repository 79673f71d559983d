"""Placement and topology segments, and the fabric map."""

from pathlib import Path
from typing import Any

import pytest

from nvmeof_csi.errors import ConfigError, ResourceExhausted
from nvmeof_csi.rpc.endpoints import Endpoint
from nvmeof_csi.service.contracts import TopologyRequirement
from nvmeof_csi.topology.fabric_map import AgentEntry, load_fabric_map, parse_fabric_map
from nvmeof_csi.topology.placement import (
    TOPOLOGY_ZONE,
    Candidate,
    capacity_in,
    place,
    place_pair,
    reachable,
    volume_segment,
)

FAB = "topology.csi.nvmeof.io/fabric"
RDMA = "topology.csi.nvmeof.io/transport-rdma"
EP = Endpoint.parse("unix:///x.sock")


def agent(name: str, fabric: str, zone: str = "", transports: tuple[str, ...] = ("tcp",)) -> AgentEntry:
    return AgentEntry(name, EP, fabric, zone, transports)


A = agent("a", "f1", "z1")
B = agent("b", "f1", "z2", ("tcp", "rdma"))
C = agent("c", "f2", "z1", ("tcp", "rdma"))
ALL = [Candidate(A, 100), Candidate(B, 300), Candidate(C, 500)]


def req(requisite: list[dict[str, str]] = (), preferred: list[dict[str, str]] = ()) -> TopologyRequirement:  # type: ignore[assignment]
    return TopologyRequirement(tuple(requisite), tuple(preferred))


def test_most_free_wins_without_requirements() -> None:
    assert place(ALL, 10, "tcp", None).name == "c"


def test_requisite_is_strict_and_picks_most_free_inside() -> None:
    assert place(ALL, 10, "tcp", req([{FAB: "f1"}])).name == "b"
    assert place(ALL, 10, "tcp", req([{FAB: "f1", TOPOLOGY_ZONE: "z1"}])).name == "a"
    with pytest.raises(ResourceExhausted):
        place(ALL, 200, "tcp", req([{FAB: "f1", TOPOLOGY_ZONE: "z1"}]))  # a is the only one there, too small
    with pytest.raises(ResourceExhausted):
        place(ALL, 10, "tcp", req([{FAB: "nowhere"}]))


def test_preferred_in_order() -> None:
    r = req([{FAB: "f1"}, {FAB: "f2"}], preferred=[{FAB: "f1", TOPOLOGY_ZONE: "z1"}, {FAB: "f2"}])
    assert place(ALL, 10, "tcp", r).name == "a"
    r = req([{FAB: "f1"}, {FAB: "f2"}], preferred=[{FAB: "f9"}, {FAB: "f2"}])
    assert place(ALL, 10, "tcp", r).name == "c"


def test_rdma_needs_an_rdma_agent_and_an_rdma_node() -> None:
    assert place(ALL, 10, "rdma", req([{FAB: "f1", RDMA: "true"}])).name == "b"
    with pytest.raises(ResourceExhausted):
        place(ALL, 10, "rdma", req([{FAB: "f1", RDMA: "false"}]))
    assert volume_segment(B, "rdma") == {FAB: "f1", TOPOLOGY_ZONE: "z2", RDMA: "true"}
    assert volume_segment(A, "tcp") == {FAB: "f1", TOPOLOGY_ZONE: "z1"}


def test_never_placed_where_the_segment_cannot_reach() -> None:
    for _ in range(20):
        chosen = place(ALL, 10, "tcp", req([{FAB: "f2", TOPOLOGY_ZONE: "z1"}]))
        assert reachable(chosen, "tcp", {FAB: "f2", TOPOLOGY_ZONE: "z1"})


def test_capacity_per_segment() -> None:
    assert capacity_in(ALL, "tcp", None) == 900
    assert capacity_in(ALL, "tcp", {FAB: "f1"}) == 400
    assert capacity_in(ALL, "rdma", {FAB: "f1", RDMA: "true"}) == 300
    assert capacity_in(ALL, "tcp", {FAB: "f3"}) == 0


def test_fabric_map(tmp_path: Path) -> None:
    path = tmp_path / "map.yaml"
    path.write_text(
        "agents:\n  - {name: a, endpoint: 'unix:///a.sock', fabric: f1, zone: z, transports: [tcp, rdma]}\n"
    )
    fmap = load_fabric_map(path)
    assert fmap.agent("a") == AgentEntry("a", Endpoint.parse("unix:///a.sock"), "f1", "z", ("tcp", "rdma"))


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({}, "agents"),
        ({"agents": [{"name": "a", "endpoint": "unix:///a"}]}, "'fabric' is required"),
        ({"agents": [{"name": "A_B", "endpoint": "unix:///a", "fabric": "f"}]}, "DNS label"),
        ({"agents": [{"name": "a", "endpoint": "unix:///a", "fabric": "f", "transports": ["fc"]}]}, "transports"),
        ({"agents": [{"name": "a", "endpoint": "unix:///a", "fabric": "f"}] * 2}, "unique"),
        ({"agents": [{"name": "a", "endpoint": "http://x", "fabric": "f"}]}, "endpoint"),
    ],
)
def test_fabric_map_errors_name_the_problem(doc: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_fabric_map(doc)


def fabric_agent(**fields: Any) -> dict[str, Any]:
    return {"agents": [{"name": "store-a", "endpoint": "tcp://127.0.0.1:9440", "fabric": "rack-1", **fields}]}


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"allowPlaintextLoopback": "false"}, "allowPlaintextLoopback"),  # bool("false") was True
        ({"transports": "tcp"}, "transports"),
        ({"zone": ["a", "b"]}, "'zone' must be a string"),
        ({"tls": {"cert": ["x"], "key": "k", "ca": "c"}}, "'cert' must be a string"),
        ({"tls": "yes"}, "tls must be a mapping"),
        ({"endpoint": 9440}, "'endpoint' must be a string"),
        ({"alluxiohost": "w1"}, "unknown field 'alluxiohost'"),
        ({"node": "Storage_1"}, "node 'Storage_1' must be a Kubernetes Node name"),
        ({"node": "a" * 254}, "must be a Kubernetes Node name"),
        ({"node": 7}, "'node' must be a string"),
    ],
)
def test_fabric_map_field_types_are_checked(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_fabric_map(fabric_agent(**fields))


def test_a_fabric_map_entry_names_the_node_of_its_agent() -> None:
    assert parse_fabric_map(fabric_agent(node="storage-1.lab")).agents[0].node == "storage-1.lab"
    assert parse_fabric_map(fabric_agent()).agents[0].node == ""


def test_a_replica_pair_goes_to_two_storage_nodes_that_the_same_nodes_reach() -> None:
    """Two agents on different storage nodes with one volume segment; never two zones (no zoned node would reach
    both), never two agents of one node (one power cut would take both), and a clear refusal otherwise."""
    s2, s3 = agent("s2", "f1", "z1"), agent("s3", "f1", "z2")
    s1 = AgentEntry("s1", EP, "f1", "z1", ("tcp",), node="s1")
    twin = AgentEntry("s1b", EP, "f1", "z1", ("tcp",), node="s1")  # a second agent on s1's storage node
    pair = place_pair(
        [Candidate(s1, 900), Candidate(twin, 800), Candidate(s2, 100), Candidate(s3, 1000)], 50, "tcp", None
    )
    assert [a.name for a in pair] == ["s1", "s2"]  # s3 (most room) has no partner in z2; s1b shares s1's node
    assert volume_segment(pair[0], "tcp") == volume_segment(pair[1], "tcp")
    with pytest.raises(ResourceExhausted, match="no two agents on different storage nodes"):
        place_pair([Candidate(s1, 900), Candidate(twin, 800), Candidate(s3, 1000)], 50, "tcp", None)
    with pytest.raises(ResourceExhausted, match="1 agent"):
        place_pair([Candidate(s1, 900), Candidate(s2, 10)], 50, "tcp", None)  # s2 has no room
    zoneless = [Candidate(agent("p", "f2"), 300), Candidate(agent("q", "f2"), 200), Candidate(agent("r", "f1"), 999)]
    assert [a.name for a in place_pair(zoneless, 50, "tcp", req([{FAB: "f2"}]))] == ["p", "q"]
