"""The deployed admission webhook answers the API server only (N2), and the requester it records
carries the uid and extra the API server authenticated (W1).

The attack: a tenant's pod POSTs an AdmissionReview straight to the webhook's Service, naming
``system:admin`` as the user, and gets back a requester signature the controller trusts (and,
from the validating route, answers about other namespaces). On the test cluster ClusterIPs are
loopback addresses, so the test process is such a pod. The API server itself presents its
front-proxy client certificate to ``cdi-webhook.cdi.svc`` (``testkit.cluster``'s admission
configuration), as ``docs/security.md`` tells an operator to, and every DataVolume create of
the other integration tests goes through that path.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from cdi.api.requester import ANN_REQUESTER_EXTRA, ANN_REQUESTER_UID, trusted_requester
from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.kubeconfig import ADMIN
from testkit.product import Product
from tests.integration.datavolumes.cdi_env import datavolume, dv_path

pytestmark = pytest.mark.integration

FORGED = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "forged-1",
        "operation": "CREATE",
        "namespace": "default",
        "userInfo": {"username": "system:admin", "groups": ["system:masters"]},
        "object": {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"generateName": "", "namespace": "default"},
            "spec": {"source": {"blank": {}}},
        },
    },
}


def post_review(kube: Kube, review: dict[str, Any], client_cert: tuple[Path, Path] | None) -> int:
    """POST ``review`` to the webhook Service's ClusterIP over TLS; the HTTP status."""
    ip = kube.get("/api/v1/namespaces/cdi/services/cdi-webhook")["spec"]["clusterIP"]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the server's identity is not what this test is about
    if client_cert is not None:
        ctx.load_cert_chain(*client_cert)
    conn = http.client.HTTPSConnection(ip, 443, context=ctx, timeout=10)
    try:
        body = json.dumps(review)
        conn.request("POST", "/datavolume-mutate", body, {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_review_posted_without_the_api_servers_certificate_is_refused_in_the_handshake(
    product: Product, kube: Kube
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        post_review(kube, FORGED, None)


def test_the_api_servers_client_certificate_is_answered(
    product: Product, cluster: Cluster, kube: Kube
) -> None:
    pki = cluster.state / "pki"
    cert = (pki / "front-proxy-client.crt", pki / "front-proxy-client.key")
    assert post_review(kube, FORGED, cert) == 200


def test_a_scoped_requesters_uid_and_extra_are_recorded_and_signed(
    product: Product, cluster: Cluster, kube: Kube, namespace: str
) -> None:
    # The admin acting with a scope, as a scoped token or an impersonation with extras does:
    # the API server authenticates uid and extra and puts them in the review's userInfo.
    api = cluster.api_client(ADMIN)
    for header, value in (
        ("Impersonate-User", ADMIN),
        ("Impersonate-Group", "system:masters"),
        ("Impersonate-Uid", "uid-scoped"),
        ("Impersonate-Extra-Scopes.example.com%2Fallowed", "read-only"),
    ):
        api.set_default_header(header, value)
    Kube(api).create(dv_path(namespace), datavolume("scoped", {"blank": {}}, size="8Mi"))
    dv = kube.get(dv_path(namespace, "scoped"))
    annotations = dv["metadata"]["annotations"]
    assert annotations[ANN_REQUESTER_UID] == "uid-scoped"
    assert json.loads(annotations[ANN_REQUESTER_EXTRA]) == {
        "scopes.example.com/allowed": ["read-only"]
    }
    secret = kube.get("/api/v1/namespaces/cdi/secrets/cdi-requester-key")
    requester = trusted_requester(dv, base64.b64decode(secret["data"]["key"]).strip())
    assert requester is not None
    assert requester.uid == "uid-scoped"
    assert requester.extra_dict() == {"scopes.example.com/allowed": ["read-only"]}
