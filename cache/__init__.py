"""Response state: append-only shared sequences, the per-connection cache and the response store."""
