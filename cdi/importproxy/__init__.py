"""The import proxy relay: the importers' way through the cluster's credentialed ``importProxy``
without the credentials ever reaching a tenant's namespace (S4, ``docs/security.md``)."""
