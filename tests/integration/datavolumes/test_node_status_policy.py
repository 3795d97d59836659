"""deploy/18-node-status-policy.yaml on the real API server: acting as the controller's
ServiceAccount (which RBAC lets patch ``nodes/status`` whole, for CDIConfig
maxConcurrentImportsPerNode), only ``cdi.kubevirt.io/import-slots`` of a node's capacity and
allocatable may change; another resource, a condition, an address or a label is refused.

Requests are merge patches of ``nodes/<name>/status`` impersonating the controller's
ServiceAccount with ``dryRun=All`` (kubectl would GET the node first, which the controller has
no right to and does not do): RBAC and admission run as for the controller's own patches,
nothing is written. And the policy names every field of NodeStatus the API server serves, so
a field a later Kubernetes adds cannot slip past it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cdi.api.constants import IMPORT_SLOTS_RESOURCE
from testkit.kubeclient import MERGE_PATCH, ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import REPO

pytestmark = pytest.mark.integration

CONTROLLER_SA = "system:serviceaccount:cdi:cdi-controller"
POLICY = "cdi-controller-node-status"


NOT_READY = {"type": "Ready", "status": "False", "reason": "Stolen", "message": "no"}


def _node(kube: Kube) -> dict[str, Any]:
    return kube.get("/api/v1/nodes")["items"][0]


def _as_controller(product: Product, node: str, patch: dict[str, Any]) -> str:
    """'' when admitted, else the API server's refusal."""
    controller = Kube(product.cluster.api_client())
    controller.api.set_default_header("Impersonate-User", CONTROLLER_SA)
    try:
        controller.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            patch,
            query={"dryRun": "All"},
            content_type=MERGE_PATCH,
        )
    except ApiError as e:
        return str(e)
    return ""


def _slots(value: str) -> dict[str, Any]:
    return {"status": {"capacity": {IMPORT_SLOTS_RESOURCE: value},
                       "allocatable": {IMPORT_SLOTS_RESOURCE: value}}}  # fmt: skip


@pytest.fixture
def policy_loaded(product: Product, kube: Kube) -> str:
    """The API server applies a new policy a moment after it is created: wait for a refusal."""
    node = _node(kube)["metadata"]["name"]
    answers: list[str] = []

    def refused() -> bool:
        answers.append(_as_controller(product, node, {"status": {"capacity": {"cpu": "999"}}}))
        return POLICY in answers[-1]

    try:
        wait_until(refused, "the node status policy to refuse", 30)
    except TimeoutError:
        api = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
        policy = kube.get(f"{api}/{POLICY}")
        raise AssertionError((answers[-1], policy.get("status"))) from None
    return node


def test_the_controller_may_change_only_the_import_slots_of_a_node(
    product: Product, kube: Kube, policy_loaded: str
) -> None:
    node = policy_loaded
    assert _as_controller(product, node, _slots("3")) == ""
    assert _as_controller(product, node, _slots("100000")) == ""
    refused = {
        "cpu": {"status": {"capacity": {"cpu": "512"}, "allocatable": {"cpu": "512"}}},
        "memory": {"status": {"allocatable": {"memory": "1Ti"}}},
        "a slot and cpu": {"status": {"capacity": {IMPORT_SLOTS_RESOURCE: "2", "cpu": "64"}}},
        "another extended resource": {"status": {"capacity": {"example.com/gpu": "8"}}},
        "Ready": {"status": {"conditions": [NOT_READY]}},
        "addresses": {"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}},
        "a label": {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
        "an annotation": {"metadata": {"annotations": {"example.com/x": "y"}}},
    }
    for what, patch in refused.items():
        answer = _as_controller(product, node, patch)
        assert POLICY in answer and "HTTP 403" in answer, (what, answer)


def test_the_policy_names_every_field_of_node_status_the_api_server_serves(kube: Kube) -> None:
    schema = kube.get("/openapi/v3/api/v1")["components"]["schemas"]
    served = set(schema["io.k8s.api.core.v1.NodeStatus"]["properties"])
    text = (REPO / "deploy" / "18-node-status-policy.yaml").read_text()
    named = set(re.findall(r"object\.status\.\?(\w+)", text))
    assert served <= named, sorted(served - named)
