"""The GPU node's side of NVMe-oF: the kernel-initiator connector, the sysfs model of subsystems, controllers,
paths and ANA, block uevents, and the node's host identity."""
