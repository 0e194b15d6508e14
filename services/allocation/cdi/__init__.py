"""CDI: the specs this driver writes, the container edits per backend and their allowlist."""
