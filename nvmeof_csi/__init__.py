"""nvmeof-csi: a Kubernetes CSI driver for NVMe-over-Fabrics volumes."""

DRIVER_NAME = "csi.nvmeof.io"
TOPOLOGY_PREFIX = "topology.csi.nvmeof.io/"
TOPOLOGY_FABRIC = TOPOLOGY_PREFIX + "fabric"
TOPOLOGY_RDMA = TOPOLOGY_PREFIX + "transport-rdma"

#: the package's version, as ``pyproject.toml`` states it (tests/unit/test_version.py keeps the two equal): a
#: literal, not ``importlib.metadata`` (which costs every process of the driver a third of a second at start
#: under emulation, and the package's metadata need not be installed)
__version__ = "0.1.0"
