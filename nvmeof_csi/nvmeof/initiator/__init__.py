"""GPU-node side: kernel initiator connect/disconnect, sysfs model, device discovery (node issue)."""
