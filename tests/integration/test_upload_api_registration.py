"""deploy/upload/50-upload.yaml on the real control plane, the token API and the proxy as pods: the
token API makes its serving certificate, publishes the CA bundle into its APIService, and the
kube-apiserver marks the APIService Available and serves our discovery documents through
aggregation; the proxy, reached through its Service, verifies tokens with the published
public keys and refuses with CDI's statuses from what it reads in the cluster.

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

import asyncio
import base64
import datetime as dt
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from cdi.kube.client import PVCS, SECRETS, Kube
from cdi.upload.kubestore import SERVICES, SecretKeyStore
from cdi.upload.token import UploadGrant, issue
from testkit.cluster import Cluster
from testkit.kubeclient import ApiError
from testkit.kubeclient import Kube as HarnessKube
from testkit.waiting import wait_until
from tests.integration.datavolumes.test_deploy import apply, object_path

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "upload" / "50-upload.yaml"
API_SERVICE = "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.upload.cdi.kubevirt.io"
SERVICE_NAME = "cdi-uploadproxy.cdi.svc"
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
    return [d for d in yaml.safe_load_all(DEPLOY.read_text()) if d]


@pytest.fixture(scope="module")
def upload_plane(cluster: Cluster, kube: HarnessKube) -> Iterator[None]:
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
    upload_plane: None, kube: HarnessKube
) -> None:
    svc = wait_until(lambda: _available(kube), "APIService v1beta1.upload.cdi.kubevirt.io", 120)
    assert svc["spec"].get("caBundle"), "the process published its CA bundle"
    assert not svc["spec"].get("insecureSkipTLSVerify")
    resources = kube.get("/apis/upload.cdi.kubevirt.io/v1beta1")
    (resource,) = resources["resources"]
    assert (resource["name"], resource["verbs"]) == ("uploadtokenrequests", ["create"])
    groups = kube.get("/apis")["groups"]
    assert "upload.cdi.kubevirt.io" in {g["name"] for g in groups}


def _deployment_available(kube: HarnessKube, name: str) -> bool:
    dep = kube.get(f"/apis/apps/v1/namespaces/cdi/deployments/{name}")
    conditions = (dep.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


def _proxy_ca(gateway: Kube) -> bytes:
    secret = gateway.get(SECRETS, "cdi-uploadproxy-server-cert", "cdi")
    return base64.b64decode(secret["data"]["ca.crt"])


def _upload_pvc(name: str, **annotations: str) -> dict[str, Any]:
    ann = {"cdi.kubevirt.io/storage.upload.target": "", **annotations}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "annotations": ann},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    }


async def _post(gateway: Kube, token: str | None) -> tuple[int, str]:
    svc = gateway.get(SERVICES, "cdi-uploadproxy", "cdi")
    url = f"https://{svc['spec']['clusterIP']}:443/v1beta1/upload"
    ctx = ssl.create_default_context(cadata=_proxy_ca(gateway).decode())
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, data=b"x", headers=headers, ssl=ctx, server_hostname=SERVICE_NAME) as r,
    ):
        return r.status, await r.text()


def test_the_deployed_proxy_verifies_tokens_and_refuses_with_cdis_statuses(
    upload_plane: None, kube: HarnessKube, cluster: Cluster, namespace: str
) -> None:
    wait_until(lambda: _deployment_available(kube, "cdi-uploadproxy"), "the proxy", 120)
    wait_until(lambda: _available(kube), "the token API (it publishes the keys)", 120)
    gateway = Kube(cluster.api_client())
    ring, _ = SecretKeyStore(gateway, "cdi").read()
    assert ring is not None
    gateway.create(PVCS, _upload_pvc("waiting"), namespace)
    gateway.create(
        PVCS, _upload_pvc("ready", **{"cdi.kubevirt.io/storage.pod.ready": "true"}), namespace
    )

    def token(name: str) -> str:
        uid = (gateway.get_or_none(PVCS, name, namespace) or {}).get("metadata", {}).get("uid")
        return issue(ring, UploadGrant(namespace, name, uid or "none"), dt.datetime.now(dt.UTC))

    async def run() -> list[tuple[int, str]]:
        return [
            await _post(gateway, None),
            await _post(gateway, token("missing")),
            await _post(gateway, token("waiting")),
            await _post(gateway, token("ready")),
        ]

    no_auth, missing, waiting, ready = asyncio.run(run())
    assert no_auth[0] == 400
    assert missing == (503, "rejecting Upload Request for PVC missing that doesn&#x27;t exist")
    assert waiting == (503, "context deadline exceeded")
    assert ready == (
        502,
        "error in upload-proxy: http: proxy error: dial tcp: lookup "
        f"cdi-upload-ready.{namespace}.svc: no such host",
    )
