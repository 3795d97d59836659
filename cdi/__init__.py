"""Control plane of the CDI-compatible storage service: API contract, gateway, reconcilers, webhooks, CLI."""
