"""nvmeofctl, the admin CLI (one module per command group)."""
