"""Importer-only sources: HTTP(S), later the registry. Shared ones live in datapath.sources."""
