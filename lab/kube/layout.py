"""The Kubernetes tier's machines: the control plane on this host, and three lab VMs as its nodes, wired by the lab
cluster's links (``lab/cluster.py``: ``mgmt``, ``fa``, ``fb``) besides each VM's own way to the API server.

| node | role (label) | RDMA | memory |
|---|---|---|---|
| ``storage-1`` | storage node: the agent DaemonSet, the controller, the snapshot controller | soft-RoCE | 2.5 GiB |
| ``gpu-1`` | GPU node: the node plugin and the workloads | soft-RoCE | 3 GiB |
| ``gpu-2`` | GPU node: the node plugin and the workloads | TCP only | 3 GiB |

Each node's address (kubelet ``--node-ip``, the Node's InternalIP, where hostNetwork pods listen) is
``10.99.10.<n>`` on its ``mgmt`` link (kubelet refuses the link's own link-local address); its pods get
``10.88.<n>.0/24`` and every node routes the others' pod ranges over ``mgmt`` (a flat pod network without
overlay, like kubenet). Each node has its own NVMe host identity, as an operator provisions one.

Contract: pure data and functions of it; nothing here starts anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lab.cluster import NodeSpec, address

STORAGE_LABEL = {"csi.nvmeof.io/storage-node": "true"}
GPU_LABEL = {"csi.nvmeof.io/gpu-node": "true"}
AGENT_PORT = 9440
#: the API-server NIC's MAC in every VM (each VM has its own user network, so one MAC serves all)
KUBE_MAC = "52:54:00:4b:00:01"
NODE_NET = "10.99.10"  # /24 on mgmt, inside the lab's links only
#: where the VMs reach the host's Alluxio (QEMU guestfwd, like the API server): the REST proxy and the job
#: master's web port, as the agent's --alluxio-proxy and --alluxio-job in ci/lab-values.yaml name them
ALLUXIO_PROXY = "10.0.2.101:39999"
ALLUXIO_JOB = "10.0.2.102:20003"


@dataclass(frozen=True)
class KubeMachine:
    spec: NodeSpec
    labels: Mapping[str, str] = field(default_factory=dict)
    rdma: bool = False
    storage: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def node_ip(self) -> str:
        """A second address on ``mgmt``: kubelet refuses a link-local node IP (the links' own addresses)."""
        return f"{NODE_NET}.{self.spec.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.88.{self.spec.index}.0/24"

    @property
    def host_id(self) -> str:
        return f"6c61622d-6e6f-4465-8000-0000000000{self.spec.index:02x}"

    @property
    def host_nqn(self) -> str:
        return f"nqn.2014-08.org.nvmexpress:uuid:{self.host_id}"

    def agent_env(self) -> str:
        """The storage node's ``agent.env`` (docs/install.md): portals A and B on its two fabric links, TCP and
        RDMA (the TCP and RDMA portals of one link share an address and port: different transports), and a TLS
        portal on each link for ``tls: psk`` volumes (class ``lab-auth``)."""
        fa, fb = address(self.spec, "fa"), address(self.spec, "fb")
        portals = (
            f"1:tcp:{fa}:4420:a 2:tcp:{fb}:4421:b 3:rdma:{fa}:4420:a 4:rdma:{fb}:4421:b "
            f"5:tcp:{fa}:4430:a:tls 6:tcp:{fb}:4431:b:tls"
        )
        return f'NVMEOF_CSI_AGENT_PORTALS="{portals}"\nNVMEOF_CSI_AGENT_NAME={self.name}\n'


MACHINES = (
    KubeMachine(NodeSpec("storage-1", 1, 2560, 2), STORAGE_LABEL, rdma=True, storage=True),
    KubeMachine(NodeSpec("gpu-1", 11, 3072, 2), GPU_LABEL, rdma=True),
    KubeMachine(NodeSpec("gpu-2", 12, 3072, 2), GPU_LABEL),
)
BY_NAME = {m.name: m for m in MACHINES}
STORAGE = "storage-1"
GPUS = tuple(m.name for m in MACHINES if not m.storage)


def routes(machine: KubeMachine) -> list[tuple[str, str]]:
    """(pod range, via) of every other node: the other nodes' pods are reached over ``mgmt``."""
    return [(m.pod_cidr, m.node_ip) for m in MACHINES if m.name != machine.name]
