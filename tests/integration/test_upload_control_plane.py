"""The upload control plane's cluster side against the real kube-apiserver: the signing ring
in a Secret, its public keys in a ConfigMap, CAs in Secrets, the front-proxy settings the
API server publishes, SubjectAccessReviews through deploy/50-upload.yaml's roles, and a token
bound to a PVC's UID refused after the PVC is deleted and re-created.

The aggregated API itself, deployed and reached through the kube-apiserver, is tested in
tests/integration/datavolumes/test_upload_api_registration.py."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from cdi.api.cdiresource import Lifetime
from cdi.kube.client import PODS, PVCS, SECRETS, AsyncKube, Kube
from cdi.kube.errors import NotFound
from cdi.pki.upload import (
    CA_BUNDLE_KEY,
    CONFIG_MAPS,
    PROXY_CLIENT_SECRET,
    SERVER_CA_BUNDLE,
    ProxyCredentials,
    UploadCAs,
    UploadLifetimes,
    ensure_ca_state,
    secret_data,
)
from cdi.pki.uploadca import fingerprints
from cdi.render.upload_pod import ANN_CLIENT_CAS
from cdi.upload.errors import InvalidToken
from cdi.upload.keys import KeyRing, StoreConflict, ensure_ring, new_key
from cdi.upload.kubestore import (
    KubeAccessReviewer,
    KubeUploadTargets,
    SecretKeyStore,
    publish_public_keys,
    read_public_keys,
    requestheader_settings,
)
from cdi.upload.readiness import upload_target
from cdi.upload.token import verify
from cdi.upload.tokenapi import TokenApi, User
from testkit.cluster import Cluster
from testkit.kubeclient import Kube as HarnessKube
from testkit.waiting import wait_until

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "50-upload.yaml"
TENANTS = DEPLOY.parent / "13-rbac-tenants.yaml"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def gateway(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())


def test_the_signing_ring_lives_in_a_secret_and_racing_writers_converge(
    gateway: Kube, namespace: str
) -> None:
    store = SecretKeyStore(gateway, namespace)
    first = ensure_ring(store, NOW)
    assert ensure_ring(store, NOW + dt.timedelta(days=1)) == first
    _, version = store.read()
    rotated = ensure_ring(store, NOW + dt.timedelta(days=8))
    assert rotated.previous == first.current and rotated.current != first.current
    with pytest.raises(StoreConflict):
        store.write(KeyRing(new_key(NOW)), version)  # a stale writer loses
    assert store.read()[0] == rotated


def test_public_keys_reach_the_proxy_through_a_config_map(gateway: Kube, namespace: str) -> None:
    ring = ensure_ring(SecretKeyStore(gateway, namespace), NOW)
    publish_public_keys(gateway, namespace, "cdi-api-signing-public-keys", ring)
    publish_public_keys(gateway, namespace, "cdi-api-signing-public-keys", ring)  # idempotent
    assert read_public_keys(gateway, namespace, "cdi-api-signing-public-keys") == (
        ring.public_keys()
    )
    newer = KeyRing(new_key(NOW), previous=ring.current)
    publish_public_keys(gateway, namespace, "cdi-api-signing-public-keys", newer)
    publish_public_keys(gateway, namespace, "cdi-api-signing-public-keys", ring)  # a stale replica
    published = read_public_keys(gateway, namespace, "cdi-api-signing-public-keys")
    assert newer.current.kid in published and ring.current.kid in published
    newest = KeyRing(new_key(NOW), previous=newer.current)
    publish_public_keys(gateway, namespace, "cdi-api-signing-public-keys", newest)
    published = read_public_keys(gateway, namespace, "cdi-api-signing-public-keys")
    assert len(published) == 3 and newest.current.kid in published


def test_a_ca_is_created_once_and_then_reused(gateway: Kube, namespace: str) -> None:
    first = ensure_ca_state(gateway, namespace, "cdi-uploadserver-ca")
    assert ensure_ca_state(gateway, namespace, "cdi-uploadserver-ca") == first


def test_front_proxy_settings_come_from_the_kube_apiserver(gateway: Kube) -> None:
    ca, config = requestheader_settings(gateway)
    assert b"BEGIN CERTIFICATE" in ca
    assert config.allowed_names == ("front-proxy-client",)
    assert config.username_headers == ("X-Remote-User",)
    assert config.extra_prefixes == ("X-Remote-Extra-",)


def _apply_upload_roles(kube: HarnessKube) -> None:
    """The upload ClusterRoles of deploy/50-upload.yaml, and deploy/13-rbac-tenants.yaml's,
    which aggregate the token rule into the built-in ``admin`` and ``edit``: the file must not
    rely on an earlier test having installed the product."""
    upload = [d for d in yaml.safe_load_all(DEPLOY.read_text()) if d]
    tenants = [d for d in yaml.safe_load_all(TENANTS.read_text()) if d]
    for doc in [*(d for d in upload if "upload" in d["metadata"]["name"]), *tenants]:
        if doc["kind"] == "ClusterRole":
            name = doc["metadata"]["name"]
            kube.request(
                "PATCH",
                f"{RBAC}/clusterroles/{name}",
                doc,
                content_type="application/apply-patch+yaml",
                query={"fieldManager": "upload-test", "force": "true"},
            )


def _bind(kube: HarnessKube, namespace: str, user: str, role: str) -> None:
    kube.create(
        f"{RBAC}/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}".replace(":", "-").replace(".", "-")},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )


def _allowed(gateway: Kube, user: str, namespace: str) -> bool:
    async def ask() -> bool:
        kube = AsyncKube(gateway)
        try:
            return (await KubeAccessReviewer(kube).review(User(user), namespace)).allowed
        finally:
            kube.close()

    return asyncio.run(ask())


def test_editors_and_cdi_uploaders_may_create_upload_tokens_and_others_may_not(
    kube: HarnessKube, gateway: Kube, namespace: str
) -> None:
    _apply_upload_roles(kube)
    assert not _allowed(gateway, "alice", namespace)
    _bind(kube, namespace, "alice", "edit")
    wait_until(lambda: _allowed(gateway, "alice", namespace), "edit to aggregate our rule", 30)
    assert not _allowed(gateway, "bob", namespace)
    _bind(kube, namespace, "bob", "cdi-uploader")
    assert wait_until(lambda: _allowed(gateway, "bob", namespace), "bob bound", 10)
    assert not _allowed(gateway, "bob", "default")


def _pvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "annotations": {"cdi.kubevirt.io/storage.upload.target": ""}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    }


def test_a_token_for_a_deleted_and_recreated_pvc_is_refused(
    kube: HarnessKube, gateway: Kube, namespace: str
) -> None:
    _apply_upload_roles(kube)
    _bind(kube, namespace, "alice", "cdi-uploader")
    ring = KeyRing(new_key(NOW))
    gateway.create(PVCS, _pvc("disk"), namespace)
    body = b'{"kind": "UploadTokenRequest", "spec": {"pvcName": "disk"}}'

    async def run() -> tuple[int, dict[str, Any], Any]:
        async_kube = AsyncKube(gateway)
        try:

            async def current() -> KeyRing:
                return ring

            targets = KubeUploadTargets(async_kube, for_proxy=False)
            api = TokenApi(KubeAccessReviewer(async_kube), targets, current)
            code, out = await wait_for_rbac(api, namespace, body)
            gateway.delete(PVCS, "disk", namespace)
            wait_until(lambda: _gone(gateway, namespace), "the PVC deleted", 30)
            gateway.create(PVCS, _pvc("disk"), namespace)
            grant = verify(out["status"]["token"], ring.public_keys(), dt.datetime.now(dt.UTC))
            return code, out, (grant, await targets.get_pvc(namespace, "disk"))
        finally:
            async_kube.close()

    code, _, (grant, recreated) = asyncio.run(run())
    assert code == 201 and grant.name == "disk"
    with pytest.raises(InvalidToken):
        upload_target(grant, recreated, None)


async def wait_for_rbac(api: TokenApi, namespace: str, body: bytes) -> tuple[int, dict[str, Any]]:
    for _ in range(50):
        code, out = await api.create(User("alice"), namespace, body)
        if code != 403:
            return code, out
        await asyncio.sleep(0.2)
    return code, out


def _gone(gateway: Kube, namespace: str) -> bool:
    try:
        gateway.get(PVCS, "disk", namespace)
    except NotFound:
        return True
    return False


def _bundle(gateway: Kube, namespace: str) -> list[x509.Certificate]:
    data = gateway.get_or_none(CONFIG_MAPS, SERVER_CA_BUNDLE, namespace) or {}
    return x509.load_pem_x509_certificates(data["data"][CA_BUNDLE_KEY].encode())


def _proxy_client(gateway: Kube, namespace: str) -> x509.Certificate:
    data = secret_data(gateway.get_or_none(SECRETS, PROXY_CLIENT_SECRET, namespace) or {})
    return x509.load_pem_x509_certificate(data["tls.crt"])


def _upload_pod(gateway: Kube, namespace: str, name: str, trust: bytes) -> None:
    labels = {"app": "containerized-data-importer", "cdi.kubevirt.io": "cdi-upload-server"}
    annotations = {ANN_CLIENT_CAS: ",".join(fingerprints(trust))}
    meta = {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}
    spec = {"containers": [{"name": "c", "image": "none"}]}
    gateway.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def test_the_upload_cas_rotate_in_stages_through_their_secrets(
    gateway: Kube, namespace: str
) -> None:
    """``ProxyCredentials.ensure`` (the controller's check) on a simulated clock against the
    real API server: both CAs staged, the server CA switched a stage later, the client CA only
    once no live upload pod trusts the old one alone, the proxy's client certificate re-issued
    by the new signer, the old server CA dropped after the longest upload certificate."""
    cas = UploadCAs(gateway, namespace)
    creds = ProxyCredentials(cas)
    old_server, old_client = cas.load()  # as an install made before rotation: year-long CAs
    assert creds.ensure(NOW) > dt.timedelta(minutes=1)
    assert _bundle(gateway, namespace) == [old_server.signer.cert]
    _upload_pod(gateway, namespace, "cdi-upload-before", old_client.trust)

    minute = dt.timedelta(minutes=1)
    lives = UploadLifetimes(Lifetime(10 * minute, 2 * minute), Lifetime(3 * minute, minute))
    pods = lambda: [  # noqa: E731
        frozenset(
            str((p["metadata"].get("annotations") or {}).get(ANN_CLIENT_CAS) or "").split(",")
        )
        for p in gateway.list(PODS, namespace).get("items") or []
    ]
    wait = creds.ensure(NOW, lives, pods)  # 10m asked, a year there: both staged at once
    assert dt.timedelta(seconds=1) <= wait <= dt.timedelta(seconds=15)  # a quarter stage
    server, client = cas.load()
    assert server.staged is not None and client.staged is not None
    assert server.signer == old_server.signer and client.signer == old_client.signer
    assert _bundle(gateway, namespace) == [old_server.signer.cert, server.staged.cert]
    assert fingerprints(client.trust) == fingerprints(old_client.signer.cert_pem) + fingerprints(
        client.staged.cert_pem
    )

    later = NOW + minute + dt.timedelta(seconds=1)  # a stage on
    creds.ensure(later, lives, pods)
    switched_server, waiting_client = cas.load()
    assert switched_server.signer == server.staged  # signs new upload pods' certificates now
    assert switched_server.previous_pem == old_server.signer.cert_pem
    assert waiting_client.signer == old_client.signer  # a live pod trusts the old CA alone
    assert _bundle(gateway, namespace)[0] == server.staged.cert

    _upload_pod(gateway, namespace, "cdi-upload-after", waiting_client.trust)
    gateway.delete(PODS, "cdi-upload-before", namespace)
    wait_until(lambda: len(pods()) == 1, "the old pod gone", 30)
    creds.ensure(later + dt.timedelta(seconds=2), lives, pods)
    _, switched_client = cas.load()
    assert switched_client.signer == client.staged
    assert _proxy_client(gateway, namespace).issuer == client.staged.cert.subject
    proxy = _proxy_client(gateway, namespace)
    proxy.verify_directly_issued_by(client.staged.cert)  # re-issued by the new signer

    creds.ensure(later + 3 * minute + dt.timedelta(seconds=1), lives, pods)
    assert _bundle(gateway, namespace) == [server.staged.cert]  # the longest upload cert ended
    dropped, _ = cas.load()
    assert dropped.previous_pem == b"" and dropped.signer == server.staged
