"""KubeNodes over stand-ins of the Kubernetes client's API objects: CSI node ID -> Node through this driver's
CSINode entries (re-listed on a miss or when stale), the out-of-service taint, the boot ID, a node the API does not
know, and an API that cannot be asked (UNAVAILABLE, never a guess)."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS
from typing import Any

import pytest

from nvmeof_csi.errors import Unavailable
from nvmeof_csi.kube.nodes import OUT_OF_SERVICE_TAINT, KubeNodes

DRIVER = "nvmeof.csi.io"


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status, self.reason = status, "Boom"


class Storage:
    def __init__(self) -> None:
        self.entries: dict[str, list[tuple[str, str]]] = {
            "gpu-1": [("other.csi.io", "x"), (DRIVER, "nqn.gpu-1")],
            "gpu-2": [(DRIVER, "nqn.gpu-2")],
            "storage-1": [],  # no node plugin: drivers null
        }
        self.lists = 0
        self.fail = False

    def list_csi_node(self, **kw: Any) -> NS:
        """The API's JSON, as the client hands it over with ``_preload_content=False``; a node without drivers
        has ``drivers: null`` (what the client's models refuse)."""
        assert kw.get("_preload_content") is False
        self.lists += 1
        if self.fail:
            raise ApiError(503)
        items = [
            {"metadata": {"name": n}, "spec": {"drivers": [{"name": d, "nodeID": i} for d, i in e] or None}}
            for n, e in self.entries.items()
        ]
        items.append({"metadata": None, "spec": {"drivers": [{"name": DRIVER, "nodeID": "nqn.gpu-1"}]}})  # malformed
        return NS(data=json.dumps({"items": items}).encode())


class Core:
    def __init__(self) -> None:
        self.nodes = {
            "gpu-1": NS(
                spec=NS(taints=[NS(key=OUT_OF_SERVICE_TAINT, effect="NoExecute")]),
                status=NS(node_info=NS(boot_id="b1")),
            ),
            "gpu-2": NS(spec=NS(taints=None), status=NS(node_info=NS(boot_id="b2"))),
        }

    def read_node(self, name: str, **_: Any) -> NS:
        if name not in self.nodes:
            raise ApiError(404)
        return self.nodes[name]


def test_taint_and_boot_id_by_csi_node_id() -> None:
    core, storage, now = Core(), Storage(), [0.0]
    nodes = KubeNodes(core, storage, DRIVER, ttl=60, clock=lambda: now[0])
    assert nodes.out_of_service("nqn.gpu-1") is True and nodes.out_of_service("nqn.gpu-2") is False
    assert (nodes.boot_id("nqn.gpu-1"), nodes.boot_id("nqn.gpu-2")) == ("b1", "b2")
    assert storage.lists == 1  # the map is cached
    assert nodes.out_of_service("x") is False  # another driver's ID: not ours
    assert storage.lists == 2  # a miss lists again
    now[0] = 61.0
    nodes.boot_id("nqn.gpu-1")
    assert storage.lists == 3  # stale: listed again
    del core.nodes["gpu-2"]  # the Node is gone, its CSINode not yet
    assert nodes.out_of_service("nqn.gpu-2") is False and nodes.boot_id("nqn.gpu-2") == ""
    lists = storage.lists
    assert nodes.claimed_by("nqn.gpu-1", fresh=True) == ["gpu-1"] and storage.lists == lists + 1  # never cached
    assert nodes.node_of("nqn.gpu-1") == "gpu-1"  # no bindings: its one claimant


def test_an_api_that_cannot_be_asked_is_unavailable() -> None:
    storage = Storage()
    storage.fail = True
    with pytest.raises(Unavailable, match="HTTP 503"):
        KubeNodes(Core(), storage, DRIVER).out_of_service("nqn.gpu-1")
    core = Core()
    core.read_node = lambda name, **_: (_ for _ in ()).throw(ApiError(403))  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match="cannot read Node gpu-1"):
        KubeNodes(core, Storage(), DRIVER).boot_id("nqn.gpu-1")


def test_a_boot_id_a_node_wrote_to_fail_its_own_fence_reads_as_unknown() -> None:
    core = Core()
    core.nodes["gpu-1"].status.node_info.boot_id = "../../x\nFENCE"
    assert KubeNodes(core, Storage(), DRIVER).boot_id("nqn.gpu-1") == ""


def test_a_node_id_two_csinodes_list_is_claimed_by_both_and_names_no_node() -> None:
    core, storage = Core(), Storage()
    storage.entries["gpu-3"] = [(DRIVER, "nqn.gpu-2")]  # gpu-3 booted from a disk cloned from gpu-2
    nodes = KubeNodes(core, storage, DRIVER)
    assert nodes.claimed_by("nqn.gpu-2") == ["gpu-2", "gpu-3"]
    assert nodes.claimed_by("nqn.gpu-1") == ["gpu-1"] and nodes.claimed_by("nqn.none") == []
    assert nodes.boot_id("nqn.gpu-2") == "" and nodes.out_of_service("nqn.gpu-2") is False  # no guess between two
    core.nodes["gpu-3"] = NS(spec=NS(taints=[NS(key=OUT_OF_SERVICE_TAINT, effect="NoExecute")]), status=None)
    assert nodes.out_of_service("nqn.gpu-2") is True  # one claimant is out of service: fence (it was False before)
