"""nvmeof-csi: a Kubernetes CSI driver for NVMe-over-Fabrics volumes."""

from importlib.metadata import PackageNotFoundError, version

DRIVER_NAME = "csi.nvmeof.io"
TOPOLOGY_PREFIX = "topology.csi.nvmeof.io/"
TOPOLOGY_FABRIC = TOPOLOGY_PREFIX + "fabric"
TOPOLOGY_RDMA = TOPOLOGY_PREFIX + "transport-rdma"

try:
    __version__ = version("nvmeof-csi")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
