"""Uploader worker (data plane). Reuses the importer pipeline; see docs/architecture.md."""
