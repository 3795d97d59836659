"""deploy/50-upload.yaml's token API as a pod on the real control plane: the process makes
its serving certificate, publishes the CA bundle into its APIService, and the kube-apiserver
marks the APIService Available and serves our discovery documents through aggregation.

The harness gives loopback pods no EndpointSlices (Kubernetes refuses loopback addresses),
while the aggregator's availability check wants an endpoint before it tries the ClusterIP
(which the harness's service proxy does serve): the fixture writes one slice with a
documentation address (192.0.2.10, never dialled: the aggregator routes to the ClusterIP).

Creating a token through the kube-apiserver needs its front-proxy client certificate
(``--proxy-client-cert-file``/``--proxy-client-key-file``), which the harness does not pass
yet; docs/upload.md says what it must add. The token path is covered without it by
test_upload_control_plane.py (real SubjectAccessReviews) and the component tests (a real
front-proxy certificate over TLS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError
from testkit.kubeclient import Kube as HarnessKube
from testkit.waiting import wait_until
from tests.integration.datavolumes.test_deploy import apply, object_path

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "50-upload.yaml"
API_SERVICE = "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.upload.cdi.kubevirt.io"
UPLOADPROXY = ("cdi-uploadproxy",)
PLACEHOLDER_SLICE = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {
        "name": "cdi-api-placeholder",
        "labels": {
            "kubernetes.io/service-name": "cdi-api",
            "endpointslice.kubernetes.io/managed-by": "tests.cdi-py",
        },
    },
    "addressType": "IPv4",
    "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}],
    "endpoints": [{"addresses": ["192.0.2.10"], "conditions": {"ready": True}}],
}


def _docs() -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(DEPLOY.read_text()) if d]
    return [d for d in docs if d["metadata"]["name"] not in UPLOADPROXY or "Role" in d["kind"]]


@pytest.fixture
def token_api(cluster: Cluster, kube: HarnessKube) -> Iterator[None]:
    try:
        kube.create("/api/v1/namespaces", {"metadata": {"name": "cdi"}})
    except ApiError as e:
        if not e.conflict:
            raise
    docs = _docs()
    for doc in docs:
        apply(kube, doc, dry_run=False)
    kube.create("/apis/discovery.k8s.io/v1/namespaces/cdi/endpointslices", PLACEHOLDER_SLICE)
    try:
        yield
    finally:  # an APIService without a backend would block namespace deletion: remove first
        for doc in reversed(docs):
            if doc["kind"] in ("APIService", "Deployment", "Service"):
                kube.delete_ignore_missing(object_path(doc))
        kube.delete_ignore_missing(
            "/apis/discovery.k8s.io/v1/namespaces/cdi/endpointslices/cdi-api-placeholder"
        )


def _available(kube: HarnessKube) -> dict[str, Any] | None:
    svc = kube.get_or_none(API_SERVICE) or {}
    conditions = (svc.get("status") or {}).get("conditions") or []
    ok = any(c["type"] == "Available" and c["status"] == "True" for c in conditions)
    return svc if ok else None


def test_the_token_api_registers_itself_and_serves_discovery_through_the_apiserver(
    token_api: None, kube: HarnessKube
) -> None:
    svc = wait_until(lambda: _available(kube), "APIService v1beta1.upload.cdi.kubevirt.io", 120)
    assert svc["spec"].get("caBundle"), "the process published its CA bundle"
    assert not svc["spec"].get("insecureSkipTLSVerify")
    resources = kube.get("/apis/upload.cdi.kubevirt.io/v1beta1")
    (resource,) = resources["resources"]
    assert (resource["name"], resource["verbs"]) == ("uploadtokenrequests", ["create"])
    groups = kube.get("/apis")["groups"]
    assert "upload.cdi.kubevirt.io" in {g["name"] for g in groups}
