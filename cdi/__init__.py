"""Control plane of the CDI-compatible storage service.

API contract, Kubernetes gateway, renderers, reconcilers, webhooks and CLI.
"""
