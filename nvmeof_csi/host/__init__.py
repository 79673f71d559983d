"""Side effects on the host behind small injectable interfaces (commands, mounts, filesystems, files)."""
