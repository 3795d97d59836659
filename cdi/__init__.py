"""Control plane of the CDI-compatible storage service.

The shared API contract (``cdi.api``) at the bottom; above it the control plane: Kubernetes
gateway, renderers, reconcilers, webhooks, the upload token API and proxy, certificates
(``cdi.pki``). The user's commands live in ``commands/``.
"""
