"""deploy/17-configmap-policy.yaml on the real API server: acting as the controller's
ServiceAccount (which RBAC lets create and update ConfigMaps everywhere, for the importers'
copies of importProxy.trustedCAProxy), outside its namespace only ``import-proxy-cm-*`` may be
written; a tenant's ConfigMap or one in kube-system is refused by the policy.

Requests are ``kubectl --as=system:serviceaccount:cdi:cdi-controller ... --dry-run=server``:
RBAC and admission run as for the controller's own writes, nothing is written."""

from __future__ import annotations

import json
import secrets

import pytest

from testkit.kubeclient import Kube
from testkit.product import KubectlFailed, Product
from testkit.waiting import wait_until

pytestmark = pytest.mark.integration

CONTROLLER_SA = "system:serviceaccount:cdi:cdi-controller"
POLICY = "cdi-controller-configmaps"


def _as_controller(product: Product, verb: str, namespace: str, name: str) -> str:
    """'' when admitted, else the API server's refusal."""
    body = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"ca.pem": "-----BEGIN"},
            "metadata": {"name": name, "namespace": namespace}}  # fmt: skip
    args = [f"--as={CONTROLLER_SA}", verb, "--dry-run=server", "-f", "-"]
    try:
        product.kubectl(*args, stdin=json.dumps(body))
    except KubectlFailed as e:
        return str(e)
    return ""


@pytest.fixture
def policy_loaded(product: Product, namespace: str) -> None:
    """The API server applies a new policy a moment after it is created: wait for a refusal."""
    wait_until(
        lambda: POLICY in _as_controller(product, "create", namespace, "loaded"),
        "the ConfigMap policy to refuse",
        30,
    )


def test_the_controller_writes_only_the_importers_proxy_ca_copies_outside_its_namespace(
    product: Product, kube: Kube, namespace: str, policy_loaded: None
) -> None:
    assert _as_controller(product, "create", namespace, "import-proxy-cm-disk") == ""
    kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "import-proxy-cm-old"}, "data": {"ca.pem": "old"}},
    )
    assert _as_controller(product, "replace", namespace, "import-proxy-cm-old") == ""
    # a tenant's own settings, and anything in kube-system, are not the controller's to write
    kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "settings"}, "data": {"a": "b"}},
    )
    refused = _as_controller(product, "replace", namespace, "settings")
    assert POLICY in refused and f"{namespace}/settings" in refused, refused
    stranger = f"coredns-{secrets.token_hex(3)}"
    assert POLICY in _as_controller(product, "create", "kube-system", stranger)
