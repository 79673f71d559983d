"""The Kubernetes API side: Nodes, CSINodes, taints and boot IDs read through the official client."""
