"""The NVMe-oF vocabulary, without I/O: every NQN rule (``nqn``) and the typed volume context with the one
table of connection tunables (``context``)."""
