"""X.509 node identities (pure: no I/O)."""
