"""Shared API contract between the control plane and the data-plane workers (no Kubernetes client here)."""
