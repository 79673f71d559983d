"""Backend-agnostic driver logic that the CSI servicers call."""
