"""The Kubernetes tier: binaries built from Go modules, a host control plane, the lab VM as the node."""
