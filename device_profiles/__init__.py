"""Device profiles: TOML descriptions of boards and their loader (stdlib only)."""
