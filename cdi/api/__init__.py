"""Shared API contract between the control plane and the data-plane workers.

Stdlib only: no Kubernetes client and no other layer of this project (an import-linter
contract in pyproject.toml enforces it), so the workers can import it freely.
"""
