"""Where a data set lives in Alluxio's cache: bytes held per worker host, from the block locations of its
files. The controller prefers the agent next to the worker holding the most (fabric map ``alluxioHost``);
``nvmeofctl datasets labels`` turns it into node labels a scheduler can use.

Contract: pure reads; a data set not in Alluxio yet gives ``{}``; a file's bytes are shared out over its
blocks, and a block's share goes to every host holding a copy of it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

from nvmeof_csi.datasets.client import AlluxioRest
from nvmeof_csi.nvmeof.dataset import DatasetSpec

LABEL_PREFIX = "dataset.csi.nvmeof.io/"


def bytes_by_host(rest: AlluxioRest, path: str) -> dict[str, int]:
    if not rest.exists(path):
        return {}
    held: dict[str, int] = defaultdict(int)
    for status in rest.files(path):
        if not status.block_hosts:
            continue
        share = status.length // len(status.block_hosts)
        for hosts in status.block_hosts:
            for host in set(hosts):
                held[host] += share
    return dict(held)


def node_label(spec: DatasetSpec) -> str:
    """The node label key naming a data set (label values must be short: a hash of its Alluxio path)."""
    return LABEL_PREFIX + hashlib.sha256(spec.path.encode()).hexdigest()[:16]


class CacheLocality:
    """What the controller's placement asks: bytes of a data set cached per Alluxio worker host."""

    def __init__(self, rest: AlluxioRest) -> None:
        self._rest = rest

    def __call__(self, spec: DatasetSpec) -> dict[str, int]:
        return bytes_by_host(self._rest, spec.path)
