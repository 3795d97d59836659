"""``deploy/`` installed as the README says (``kubectl apply -k deploy/``) on a real node: every
component runs as a container of the images ``scripts/images.sh`` built, and no replica
restarts on the way to Available."""

from __future__ import annotations

import pytest

from testkit.product import Product, deployments

pytestmark = pytest.mark.e2e


def test_deploy_runs_as_containers_and_no_replica_restarts(product: Product) -> None:
    apps = [name for _, name in deployments()]
    assert {"cdi-controller", "cdi-webhook"} <= set(apps)
    for app in apps:
        pods = product.pods(app)
        assert pods, f"no pod of {app}"
        for pod in pods:
            for status in pod["status"]["containerStatuses"]:
                assert status["containerID"].startswith("containerd://"), status
                assert status["image"].startswith("quay.io/cdi-py/cdi-"), status
                # Two webhook replicas publishing their CA bundle at once must not crash one.
                assert status["restartCount"] == 0, f"{pod['metadata']['name']} restarted: {status}"
    # Two replicas each, started together.
    assert len(product.pods("cdi-controller")) == 2
    assert len(product.pods("cdi-webhook")) == 2
