"""A host NQN's identity is bound to the Node the API server attested when it was first issued, durably: a
compromised GPU node that writes another node's NQN into its own CSINode while that node's plugin is
deregistered is refused while the victim's certificate may live (before the binding, it was issued the victim's
identity: ``check_node`` trusted the CSINode claim alone, through a 60 s cache)."""

from __future__ import annotations

import base64
import datetime
import json
from types import SimpleNamespace
from typing import Any

import pytest

from nvmeof_csi.errors import ConfigError, Unavailable
from nvmeof_csi.identity.certs import new_key, node_request
from nvmeof_csi.issuance.checks import NODE_CLAIM, Policy, Refused, check_node
from nvmeof_csi.kube.bindings import KEEP_EXPIRED, parse_location
from tests.support.configmaps import ApiError, binder, bound
from tests.support.node_ca import NOW

NODE_SA = "system:serviceaccount:nvmeof-csi:nvmeof-csi-node"
POLICY = Policy(NODE_SA, datetime.timedelta(hours=24))
NQN1 = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-0000-0000-000000000001"
DAY = datetime.timedelta(hours=24)


def spec(node: str, nqn: str = NQN1) -> SimpleNamespace:
    """A request from a pod on ``node`` (its token's node claim) for a node identity ``node:<node>`` + ``nqn``."""
    pem = node_request(new_key(), node, nqn)
    return SimpleNamespace(username=NODE_SA, extra={NODE_CLAIM: [node]}, usages=["client auth"],
                           request=base64.b64encode(pem).decode(), expiration_seconds=None)  # fmt: skip


def test_a_host_nqn_issued_to_one_node_is_refused_to_another_while_its_certificate_may_live() -> None:
    bindings, api = bound()
    csinodes = {NQN1: ["gpu-1"]}
    check_node(spec("gpu-1"), POLICY, lambda n: csinodes.get(n, []), binder(bindings, NOW))
    assert bindings.node_of(NQN1) == "gpu-1"
    csinodes[NQN1] = ["gpu-2"]  # gpu-1's plugin deregistered; gpu-2 claims gpu-1's NQN in its own CSINode
    for at in (NOW, NOW + DAY - datetime.timedelta(seconds=1)):
        with pytest.raises(Refused, match=r"bound to node 'gpu-1' until 2026-12-05T00:00:00"):
            check_node(spec("gpu-2"), POLICY, lambda n: csinodes.get(n, []), binder(bindings, at))
    assert bindings.node_of(NQN1) == "gpu-1"
    # once every certificate of gpu-1 has expired, the NQN may be bound anew (the grant check on the agents
    # still keeps gpu-2 off gpu-1's volumes: tests/unit/test_grant_nodes.py)
    check_node(spec("gpu-2"), POLICY, lambda n: csinodes.get(n, []), binder(bindings, NOW + DAY))
    assert bindings.node_of(NQN1) == "gpu-2"
    assert api.reads >= 4  # every decision read the ConfigMap afresh


def test_a_renewal_by_the_same_node_extends_its_binding_and_writes_only_when_it_grows() -> None:
    bindings, api = bound()
    assert bindings.bind(NQN1, "gpu-1", NOW + DAY, NOW) == ""
    version = api.maps["bindings"][1]
    assert bindings.bind(NQN1, "gpu-1", NOW + DAY / 2, NOW) == ""  # a shorter one: nothing to write
    assert api.maps["bindings"][1] == version
    assert bindings.bind(NQN1, "gpu-1", NOW + 2 * DAY, NOW + DAY) == ""
    entry = json.loads(next(iter(api.maps["bindings"][0].values())))
    assert entry == {"nqn": NQN1, "node": "gpu-1", "until": (NOW + 2 * DAY).isoformat()}


def test_two_signers_never_both_win_and_an_api_that_refuses_leaves_the_request_undecided() -> None:
    bindings, api = bound()
    other, _ = bound(api)
    original = api.read_namespaced_config_map

    def raced(name: str, namespace: str, **kw: Any) -> Any:
        found = original(name, namespace, **kw)
        api.read_namespaced_config_map = original  # type: ignore[method-assign]
        other.bind(NQN1, "gpu-2", NOW + DAY, NOW)  # another replica writes between our read and our write
        return found

    api.read_namespaced_config_map = raced  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match="HTTP 409 Conflict"):
        bindings.bind(NQN1, "gpu-1", NOW + DAY, NOW)
    assert bindings.node_of(NQN1) == "gpu-2"
    assert "bound to node 'gpu-2'" in bindings.bind(NQN1, "gpu-1", NOW + DAY, NOW)
    missing, _ = bound(api, "gone")
    api.maps.pop("gone", None)
    with pytest.raises(Unavailable, match="HTTP 404"):
        missing.bind(NQN1, "gpu-1", NOW + DAY, NOW)


def test_an_unreadable_expiry_counts_as_live_and_old_expired_bindings_are_dropped() -> None:
    bindings, api = bound()
    assert bindings.bind(NQN1, "gpu-1", NOW + DAY, NOW) == ""
    data = api.maps["bindings"][0]
    key = next(iter(data))
    data[key] = json.dumps({"nqn": NQN1, "node": "gpu-1", "until": "not a time"})
    data["foreign"] = "not json"  # someone else's key: kept, never read as a binding
    assert "bound to node 'gpu-1'" in bindings.bind(NQN1, "gpu-2", NOW + DAY, NOW + 400 * DAY)
    nqn2 = NQN1[:-1] + "2"
    data[key] = json.dumps({"nqn": NQN1, "node": "gpu-1", "until": NOW.isoformat()})
    assert bindings.bind(nqn2, "gpu-2", NOW + KEEP_EXPIRED + 2 * DAY, NOW + KEEP_EXPIRED + DAY) == ""
    assert bindings.node_of(NQN1) == "" and bindings.node_of(nqn2) == "gpu-2"  # NQN1's was 31 days expired
    assert bindings.bind(nqn2, "gpu-3", NOW, NOW) != ""


def test_a_bind_keeps_the_charts_labels_annotations_and_foreign_keys() -> None:
    """A replace is a PUT: before, the first binding dropped the chart's labels and its ``resource-policy: keep``
    (so ``helm uninstall`` deleted the bindings with the release) and any key that was not a binding."""
    bindings, api = bound()
    api.meta["bindings"] = {"labels": {"app.kubernetes.io/part-of": "nvmeof-csi"},
                            "annotations": {"helm.sh/resource-policy": "keep"}}  # fmt: skip
    api.maps["bindings"] = ({"note": "an operator's"}, 1)
    assert bindings.bind(NQN1, "gpu-1", NOW + DAY, NOW) == ""
    assert api.meta["bindings"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert api.meta["bindings"]["labels"] == {"app.kubernetes.io/part-of": "nvmeof-csi"}
    assert api.maps["bindings"][0]["note"] == "an operator's" and bindings.node_of(NQN1) == "gpu-1"


def test_the_bindings_location_is_namespace_and_name() -> None:
    assert parse_location("nvmeof-csi/nvmeof-csi-identity-bindings") == ("nvmeof-csi", "nvmeof-csi-identity-bindings")
    for bad in ("", "nvmeof-csi", "/name", "ns/", "a/b/c"):
        with pytest.raises(ConfigError, match="NAMESPACE/NAME"):
            parse_location(bad)
    assert ApiError(409).status == 409
