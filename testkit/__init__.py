"""Test-only tooling: a real Kubernetes control plane built from Go modules (hack/kube), a local
node that runs pods as processes, and a local volume provisioner.

Nothing here is product code; the product packages never import it. Entry points:
``python -m testkit.cluster up`` for a developer, ``tests/integration/conftest.py`` for pytest.
"""
