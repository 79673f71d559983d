"""Where data sets are: how many bytes of one each Alluxio worker caches, placement next to the cached copy, and
``nvmeofctl datasets``."""

from __future__ import annotations

from types import SimpleNamespace

from nvmeof_csi.cli.datasets import summarize
from nvmeof_csi.datasets.client import FileStatus


def test_nvmeofctl_datasets_summary() -> None:
    def vol(name: str, status: str = "ready", **labels: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, status=status, parameters={"dataset.path": "/ds/a"}, labels=labels)

    rows = summarize(
        [
            (
                "s1",
                vol(
                    "a",
                    **{
                        "dataset.bytes": "100",
                        "dataset.cacheBytes": "0",
                        "dataset.ufsBytes": "100",
                        "dataset.workers": "w1",
                    },
                ),
            ),
            (
                "s1",
                vol(
                    "b",
                    **{
                        "dataset.bytes": "100",
                        "dataset.cacheBytes": "100",
                        "dataset.ufsBytes": "0",
                        "dataset.workers": "w1,w2",
                    },
                ),
            ),
            ("s2", vol("c", status="creating", **{"dataset.progress": "copying: 3/10 files, 1/4 MiB"})),
            ("s2", SimpleNamespace(name="plain", status="ready", parameters={}, labels={})),
        ]
    )
    assert len(rows) == 1
    row = rows[0]
    assert row["volumes"] == ["s1/a", "s1/b"] and row["hit_ratio"] == "0.500" and row["cached_on"] == ["w1", "w2"]
    assert row["hydrating"] == ["s2/c: copying: 3/10 files, 1/4 MiB"]


def test_bytes_by_host_shares_a_file_over_its_blocks() -> None:
    from nvmeof_csi.datasets.locality import bytes_by_host

    statuses = [
        FileStatus("/ds/a", False, 200, False, -1, "", 100, (), "", block_hosts=(("w1",), ("w1", "w2"))),
        FileStatus("/ds/b", False, 50, False, -1, "", 0, (), "", block_hosts=()),
    ]
    rest = SimpleNamespace(exists=lambda _p: True, files=lambda _p: statuses)
    assert bytes_by_host(rest, "/ds") == {"w1": 200, "w2": 100}  # type: ignore[arg-type]
    assert bytes_by_host(SimpleNamespace(exists=lambda _p: False), "/ds") == {}  # type: ignore[arg-type]


def test_placement_prefers_the_agent_next_to_the_cached_data_set_within_the_requisite() -> None:
    """``place`` itself (the controller's path through CreateVolume: tests/component/test_dataset_placement.py)."""
    from nvmeof_csi.service.contracts import TopologyRequirement
    from nvmeof_csi.topology.fabric_map import parse_fabric_map
    from nvmeof_csi.topology.placement import Candidate, place

    fabric = parse_fabric_map(
        {
            "agents": [
                {"name": "a", "endpoint": "unix:///a", "fabric": "f1", "alluxioHost": "w1"},
                {"name": "b", "endpoint": "unix:///b", "fabric": "f2", "alluxioHost": "w2"},
                {"name": "c", "endpoint": "unix:///c", "fabric": "f1"},
            ]
        }
    )
    assert [a.alluxio_host for a in fabric.agents] == ["w1", "w2", ""]
    cached = {"a": 10, "b": 90}
    cands = [Candidate(a, free) for a, free in zip(fabric.agents, (1 << 30, 1 << 30, 1 << 40), strict=True)]
    assert place(cands, 1 << 20, "tcp", None, cached).name == "b"
    f1_only = TopologyRequirement(requisite=({"topology.csi.nvmeof.io/fabric": "f1"},), preferred=())
    assert place(cands, 1 << 20, "tcp", f1_only, cached).name == "a", "requisite still binds"
    assert place(cands, 1 << 20, "tcp", f1_only, {}).name == "c", "without a cache: most free room"
