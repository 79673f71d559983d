"""The driver's one way to a target agent: the gRPC client, what the driver needs of an agent, its messages as
service types, and the node's own reads (live limits, host keys). Nothing outside ``cmd`` imports ``agent``."""
