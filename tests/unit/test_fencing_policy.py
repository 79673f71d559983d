"""When an unpublish fences (reason x taint x ``--fence-on``), when a fenced node may publish again, and what the
controller's service does with each (over the fake backend)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.nvmeof.parameters import VolumeParameters
from nvmeof_csi.service.contracts import StaticNodes
from nvmeof_csi.service.fencing import (
    CLEANUP_SUCCEEDED,
    CLEANUP_TIMEOUT,
    FENCE_ON_CHOICES,
    OUT_OF_SERVICE,
    TAINT,
    TAINT_REASON,
    fence_reason,
    may_unfence,
    needs_taint,
    parse_fence_on,
)
from nvmeof_csi.service.provisioning import CapacityRange, GiB, VolumeService
from tests.support.fakes import FakeBackend

REASONS = ("", OUT_OF_SERVICE, CLEANUP_TIMEOUT, CLEANUP_SUCCEEDED)
SETTINGS = [frozenset(c) for n in range(4) for c in itertools.combinations(FENCE_ON_CHOICES, n)]


def expected(reason: str, tainted: bool, fence_on: frozenset[str]) -> str:
    """The table in ``service/fencing.py``, row by row."""
    if reason == CLEANUP_SUCCEEDED:
        return ""
    if reason in (OUT_OF_SERVICE, CLEANUP_TIMEOUT) and reason in fence_on:
        return reason
    return TAINT_REASON if TAINT in fence_on and tainted else ""


@pytest.mark.parametrize("fence_on", SETTINGS, ids=lambda s: "+".join(sorted(s)) or "none")
@pytest.mark.parametrize("reason", REASONS, ids=lambda r: r or "unset")
@pytest.mark.parametrize("tainted", [False, True], ids=["untainted", "tainted"])
def test_the_decision_table(reason: str, tainted: bool, fence_on: frozenset[str]) -> None:
    read = tainted if needs_taint(reason, fence_on) else None  # the Node is read only when it matters
    assert fence_reason(reason, fence_on, read) == expected(reason, tainted, fence_on)


def test_the_default_fences_on_both_reasons_and_the_taint_and_none_turns_it_off() -> None:
    assert set(FENCE_ON_CHOICES) == {OUT_OF_SERVICE, CLEANUP_TIMEOUT, TAINT}
    assert parse_fence_on("none") == frozenset() == parse_fence_on("")
    assert parse_fence_on(" taint ,NODE_OUT_OF_SERVICE") == {TAINT, OUT_OF_SERVICE}
    with pytest.raises(ValueError, match="unknown NODE_GONE"):
        parse_fence_on("NODE_GONE")


@pytest.mark.parametrize(
    ("recorded", "current", "may"),
    [("a", "b", True), ("a", "a", False), ("", "b", False), ("a", "", False), ("", "", False)],
)
def test_a_fenced_node_gets_the_volume_back_only_after_a_reboot_both_sides_saw(
    recorded: str, current: str, may: bool
) -> None:
    assert may_unfence(recorded, current) is may


@dataclass
class Facts:
    tainted: set[str] = field(default_factory=set)
    boots: dict[str, str] = field(default_factory=dict)
    taint_reads: list[str] = field(default_factory=list)
    claims: dict[str, list[str]] = field(default_factory=dict)

    def out_of_service(self, node_id: str) -> bool | None:
        self.taint_reads.append(node_id)
        return node_id in self.tainted

    def boot_id(self, node_id: str) -> str:
        return self.boots.get(node_id, "")

    def claimed_by(self, node_id: str) -> list[str]:
        return self.claims.get(node_id, [])

    def node_of(self, node_id: str) -> str:
        claims = self.claims.get(node_id, [])
        return claims[0] if len(claims) == 1 else ""


def service(facts: Facts, fence_on: frozenset[str] = frozenset(FENCE_ON_CHOICES)) -> tuple[VolumeService, FakeBackend]:
    backend = FakeBackend(100 * GiB)
    return VolumeService(backend, StaticNodes(frozenset({"n1", "n2"})), facts=facts, fence_on=fence_on), backend


def test_an_out_of_service_unpublish_fences_and_the_node_is_refused_until_it_rebooted() -> None:
    facts = Facts(boots={"n1": "boot-1"})
    svc, backend = service(facts)
    vol = svc.create("pvc", CapacityRange(GiB), VolumeParameters.parse({}))
    svc.publish(vol.ref, "n1", readonly=False)
    assert svc.unpublish(vol.ref, "n1", OUT_OF_SERVICE) == OUT_OF_SERVICE
    assert facts.taint_reads == []  # the reason said it all
    fenced = backend.volumes[vol.ref.uuid]
    assert fenced.published_nodes == () and fenced.fenced["n1"].boot_id == "boot-1"
    with pytest.raises(FailedPrecondition, match="nvmeofctl hosts unfence"):
        svc.publish(vol.ref, "n1", readonly=False)
    facts.boots["n1"] = "boot-2"  # it rebooted
    svc.publish(vol.ref, "n1", readonly=False)
    assert backend.volumes[vol.ref.uuid].fenced == {} and backend.volumes[vol.ref.uuid].published_nodes == ("n1",)


def test_without_a_reason_the_taint_decides_and_a_clean_unpublish_never_fences() -> None:
    facts = Facts(tainted={"n2"})
    svc, backend = service(facts)
    vol = svc.create("pvc", CapacityRange(GiB), VolumeParameters.parse({}))
    for node in ("n1", "n2"):
        svc.publish(vol.ref, node, readonly=True)
    assert svc.unpublish(vol.ref, "n1") == "" and svc.unpublish(vol.ref, "n2") == TAINT_REASON
    assert set(backend.volumes[vol.ref.uuid].fenced) == {"n2"}
    facts.taint_reads.clear()
    svc.publish(vol.ref, "n1", readonly=True)
    assert svc.unpublish(vol.ref, "n1", CLEANUP_SUCCEEDED) == "" and facts.taint_reads == []


def test_fencing_turned_off_only_revokes_the_grant() -> None:
    svc, backend = service(Facts(tainted={"n1"}), fence_on=frozenset())
    vol = svc.create("pvc", CapacityRange(GiB), VolumeParameters.parse({}))
    svc.publish(vol.ref, "n1", readonly=False)
    assert svc.unpublish(vol.ref, "n1", OUT_OF_SERVICE) == ""
    assert backend.volumes[vol.ref.uuid].fenced == {} and backend.volumes[vol.ref.uuid].published_nodes == ()


def test_a_host_identity_several_nodes_claim_is_refused_until_only_one_does() -> None:
    """A cloned /etc/nvme/hostnqn: two machines, one node ID; the target could not tell them apart."""
    facts = Facts(claims={"n1": ["gpu-a", "gpu-b"]})
    svc, backend = service(facts)
    vol = svc.create("pvc", CapacityRange(GiB), VolumeParameters.parse({}))
    with pytest.raises(FailedPrecondition, match=r"claimed by 2 Nodes \(gpu-a, gpu-b\)"):
        svc.publish(vol.ref, "n1", readonly=False)
    assert backend.volumes[vol.ref.uuid].published_nodes == ()
    facts.claims["n1"] = ["gpu-a"]  # the clone got its own identity
    svc.publish(vol.ref, "n1", readonly=False)
    assert backend.volumes[vol.ref.uuid].published_nodes == ("n1",)


def test_a_publish_names_the_node_its_node_id_is_to_the_backend() -> None:
    facts = Facts(claims={"n1": ["gpu-1"]})
    svc, backend = service(facts)
    vol = svc.create("pvc", CapacityRange(GiB), VolumeParameters.parse({}))
    svc.publish(vol.ref, "n1", readonly=False)
    assert backend.node_names == {"n1": "gpu-1"}
