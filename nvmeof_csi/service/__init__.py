"""Backend-agnostic driver logic the CSI servicers call (provisioning, staging), the protocols every backend
implements with their contracts, and the domain values that cross them."""
