"""The token API and the upload proxy as the installed product (deploy/50-upload.yaml, applied
with the rest of deploy/ by ``testkit.product``): the token API makes its serving certificate
and publishes the CA bundle into its APIService; the kube-apiserver marks the APIService
Available (the harness's service proxy writes the Service's EndpointSlice) and serves our
discovery documents through aggregation; a user's ``UploadTokenRequest`` goes through the
kube-apiserver (front-proxy client certificate, RBAC) to our API and back with a token; the
proxy, reached through its Service, verifies tokens with the published public keys and refuses
with CDI's statuses from what it reads in the cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from typing import Any

import aiohttp
import pytest

from cdi.kube.client import CONFIG_MAPS, PVCS, Kube
from cdi.upload.kubestore import SERVICES, SecretKeyStore, read_public_keys
from cdi.upload.token import UploadGrant, issue, verify
from testkit.cluster import Cluster
from testkit.kubeclient import ApiError
from testkit.kubeclient import Kube as HarnessKube
from testkit.product import Product
from testkit.waiting import wait_until

pytestmark = pytest.mark.integration
API_SERVICE = "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.upload.cdi.kubevirt.io"
SERVICE_NAME = "cdi-uploadproxy.cdi.svc"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def _available(kube: HarnessKube) -> dict[str, Any] | None:
    svc = kube.get_or_none(API_SERVICE) or {}
    conditions = (svc.get("status") or {}).get("conditions") or []
    ok = any(c["type"] == "Available" and c["status"] == "True" for c in conditions)
    return svc if ok else None


def test_the_token_api_registers_itself_and_serves_discovery_through_the_apiserver(
    product: Product, kube: HarnessKube
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
    """The bundle the proxy publishes (both CAs mid-rotation), as `cdi upload` trusts it."""
    published = gateway.get(CONFIG_MAPS, "cdi-uploadproxy-signer-bundle", "cdi")
    return str(published["data"]["ca-bundle.crt"]).encode()


def _upload_pvc(name: str, **annotations: str) -> dict[str, Any]:
    """An upload target on a WaitForFirstConsumer class without force-bind: the deployed
    controller starts no server for it, so the proxy sees exactly these annotations."""
    ann = {"cdi.kubevirt.io/storage.upload.target": "", **annotations}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "annotations": ann},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "testkit-fs-wffc",
            "resources": {"requests": {"storage": "1Mi"}},
        },
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
    product: Product, kube: HarnessKube, cluster: Cluster, namespace: str
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


def token_request(pvc: str) -> dict[str, Any]:
    return {
        "apiVersion": "upload.cdi.kubevirt.io/v1beta1",
        "kind": "UploadTokenRequest",
        "metadata": {"generateName": "token-for-test-"},
        "spec": {"pvcName": pvc},
    }


def bind(kube: HarnessKube, namespace: str, user: str, role: str) -> None:
    kube.create(
        f"{RBAC}/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )


def test_a_user_gets_a_token_through_the_kube_apiserver_and_a_user_without_rights_is_forbidden(
    product: Product, kube: HarnessKube, cluster: Cluster, namespace: str
) -> None:
    gateway = Kube(cluster.api_client())
    created = gateway.create(PVCS, _upload_pvc("target"), namespace)
    bind(kube, namespace, "alice", "edit")
    path = f"/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/{namespace}/uploadtokenrequests"
    alice = cluster.kube("alice")

    def issued() -> dict[str, Any] | None:
        try:  # the edit role aggregates our rule a moment after the binding
            return alice.create(path, token_request("target"))
        except ApiError as e:
            if e.status == 403:
                return None
            raise

    answer = wait_until(issued, "alice's token", 30)
    token = answer["status"]["token"]
    keys = read_public_keys(gateway, "cdi", "cdi-api-signing-public-keys")
    grant = verify(token, keys, dt.datetime.now(dt.UTC))
    assert (grant.namespace, grant.name, grant.uid) == (
        namespace,
        "target",
        created["metadata"]["uid"],
    )
    with pytest.raises(ApiError) as refused:
        cluster.kube("bob").create(path, token_request("target"))
    assert refused.value.status == 403


def test_cdiconfig_names_the_deployed_upload_proxy(product: Product, kube: HarnessKube) -> None:
    def url() -> str | None:
        config = kube.get("/apis/cdi.kubevirt.io/v1beta1/cdiconfigs/config")
        return (config.get("status") or {}).get("uploadProxyURL")

    assert wait_until(url, "CDIConfig status.uploadProxyURL", 75) == SERVICE_NAME
