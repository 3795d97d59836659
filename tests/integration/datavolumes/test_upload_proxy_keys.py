"""N5: the upload proxy, the component users reach from outside the cluster, holds no upload CA
key. On the product installed from deploy/: its ServiceAccount may not read either CA Secret,
the controller has issued its client certificate and published the server CA certificate
alone, and a proxy started with nothing but those (and the token public keys) in its namespace
relays an upload end to end and creates no CA of its own."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product, container_argv
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import Images, dv_path, wait_phase
from tests.integration.datavolumes.test_upload import User, upload_dv, user

__all__ = ["user"]  # the fixture, shared with test_upload.py

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
PROXY_SA = "system:serviceaccount:cdi:cdi-uploadproxy"
CA_SECRETS = ("cdi-uploadserver-ca", "cdi-uploadserver-client-ca")
CLIENT_CERT = "cdi-uploadserver-client-cert"
CA_BUNDLE = "cdi-uploadserver-signer-bundle"


def _allowed(kube: Kube, verb: str, resource: str, name: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": PROXY_SA,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:cdi"],
            "resourceAttributes": {
                "namespace": "cdi",
                "verb": verb,
                "resource": resource,
                "name": name,
            },
        },
    }
    answer = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def _secret(kube: Kube, ns: str, name: str) -> dict[str, bytes]:
    data = kube.get(f"/api/v1/namespaces/{ns}/secrets/{name}")["data"]
    return {k: base64.b64decode(v) for k, v in data.items()}


def _issued(kube: Kube) -> bool:
    return all(
        kube.get_or_none(path) is not None
        for path in (
            f"/api/v1/namespaces/cdi/secrets/{CLIENT_CERT}",
            f"/api/v1/namespaces/cdi/configmaps/{CA_BUNDLE}",
        )
    )


def test_the_upload_proxy_may_read_neither_upload_ca_secret(kube: Kube, product: Product) -> None:
    for name in CA_SECRETS:
        for verb in ("get", "update", "list", "watch"):
            assert not _allowed(kube, verb, "secrets", name), (verb, name)
    assert not _allowed(kube, "list", "secrets", "")
    # what it does read: its client certificate and the CA certificate, never more
    assert _allowed(kube, "get", "secrets", CLIENT_CERT)
    assert not _allowed(kube, "update", "secrets", CLIENT_CERT)
    assert _allowed(kube, "get", "configmaps", CA_BUNDLE)
    # the same through an impersonated request, as the proxy's own token would be judged
    proxy = Kube(product.cluster.api_client())
    proxy.api.set_default_header("Impersonate-User", PROXY_SA)
    for name in CA_SECRETS:
        with pytest.raises(ApiError) as refused:
            proxy.get(f"/api/v1/namespaces/cdi/secrets/{name}")
        assert refused.value.status == 403


def test_the_controller_issues_the_proxy_client_certificate_and_publishes_the_ca_alone(
    kube: Kube, product: Product
) -> None:
    wait_until(lambda: _issued(kube), "the proxy's credentials issued by the controller", 60)
    client = _secret(kube, "cdi", CLIENT_CERT)
    assert set(client) == {"tls.crt", "tls.key"}
    cert = x509.load_pem_x509_certificate(client["tls.crt"])
    client_ca = x509.load_pem_x509_certificate(_secret(kube, "cdi", CA_SECRETS[1])["tls.crt"])
    assert cert.issuer == client_ca.subject
    (cn,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert cn.value == "client.upload-server.cdi.kubevirt.io"
    bundle = kube.get(f"/api/v1/namespaces/cdi/configmaps/{CA_BUNDLE}")["data"]
    assert set(bundle) == {"ca-bundle.crt"} and "PRIVATE KEY" not in bundle["ca-bundle.crt"]
    assert bundle["ca-bundle.crt"].encode() == _secret(kube, "cdi", CA_SECRETS[0])["tls.crt"]


def _copy(kube: Kube, kind: str, name: str, to: str) -> None:
    found = kube.get(f"/api/v1/namespaces/cdi/{kind}/{name}")
    body = {k: v for k, v in found.items() if k in ("apiVersion", "kind", "type", "data")}
    kube.create(f"/api/v1/namespaces/{to}/{kind}", {**body, "metadata": {"name": name}})


@pytest.fixture
def lone_proxy(
    cluster: Cluster, kube: Kube, product: Product, tmp_path: Path
) -> Iterator[tuple[str, int]]:
    """``cdi uploadproxy`` as deployed, but in a namespace of its own holding only what the
    controller issues it (copied from ``cdi``) and the token public keys: (namespace, port)."""
    ns = f"lone-proxy-{os.getpid()}"
    kube.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    )
    wait_until(lambda: _issued(kube), "the proxy's credentials issued by the controller", 60)
    _copy(kube, "secrets", CLIENT_CERT, ns)
    _copy(kube, "configmaps", CA_BUNDLE, ns)
    _copy(kube, "configmaps", "cdi-api-signing-public-keys", ns)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = container_argv("cdi-uploadproxy", {"POD_IP": "127.0.0.1"})
    argv += [f"--kubeconfig={cluster.kubeconfig}", f"--namespace={ns}", f"--port={port}"]
    with open(tmp_path / "proxy.log", "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    try:
        yield ns, port
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
        kube.delete_ignore_missing(f"/api/v1/namespaces/{ns}")


def _post(kube: Kube, ns: str, token: str, body: bytes, port: int) -> tuple[int, str] | None:
    """The proxy's answer; None while it does not listen yet."""
    found = kube.get_or_none(f"/api/v1/namespaces/{ns}/secrets/cdi-uploadproxy-server-cert")
    if found is None:
        return None
    ca = base64.b64decode(found["data"]["ca.crt"]).decode()

    async def post() -> tuple[int, str]:
        ctx = ssl.create_default_context(cadata=ca)
        url = f"https://127.0.0.1:{port}/v1beta1/upload"
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url,
                data=body,
                headers=headers,
                ssl=ctx,
                server_hostname=f"cdi-uploadproxy.{ns}.svc",
            ) as r,
        ):
            return r.status, await r.text()

    try:
        return asyncio.run(post())
    except aiohttp.ClientConnectionError:
        return None


def test_a_proxy_with_only_its_issued_credentials_relays_an_upload_and_makes_no_ca(
    kube: Kube, namespace: str, user: User, images: Images, lone_proxy: tuple[str, int]
) -> None:
    ns, port = lone_proxy
    kube.create(dv_path(namespace), upload_dv("lone"))
    wait_phase(kube, namespace, "lone", ("UploadReady",), 120)
    token, image = user.token("lone"), images.path("disk.qcow2").read_bytes()
    status, text = wait_until(
        lambda: _post(kube, ns, token, image, port), "the lone proxy to answer", 60
    )
    assert status == 200, text
    dv = wait_phase(kube, namespace, "lone", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    secrets = {s["metadata"]["name"] for s in kube.get(f"/api/v1/namespaces/{ns}/secrets")["items"]}
    assert secrets == {CLIENT_CERT, "cdi-uploadproxy-server-cert"}, secrets
