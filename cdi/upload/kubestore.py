"""The upload control plane's cluster side, all through the one gateway (``cdi.kube.client``).

- ``SecretKeyStore``: the token signing ring in Secret ``cdi-api-signing-key`` (CDI's name),
  compare-and-swap on the Secret's resourceVersion (``keys.KeyStore``);
- ``publish_public_keys`` / ``read_public_keys``: the ring's public keys in ConfigMap
  ``cdi-api-signing-public-keys``, so the proxy verifies tokens without read access to the
  private keys;
- ``KubeAccessReviewer``: SubjectAccessReviews for the token API;
- ``KubeUploadTargets``: PVC lookups for the proxy and the token API, and the upload server's
  address: the ClusterIP of Service ``cdi-upload-<pvc>`` in the PVC's namespace (``naming.
  upload_service_name``, created by the upload flavour of the controller), its certificate
  verified for ``cdi-upload-<pvc>.<ns>.svc``: no cluster DNS needed, the name still checked;
- ``read_upstream_credentials``: the proxy's side of mutual TLS to upload servers, as the
  controller keeps it (``cdi.pki.upload.ProxyCredentials``): its client key pair from a
  Secret and the upload servers' CA certificate from a ConfigMap. The proxy holds no CA key;
- ``requestheader_settings``: the front-proxy settings the kube-apiserver publishes in
  ConfigMap ``kube-system/extension-apiserver-authentication``;
- ``ApiServiceCertStore``: a ``cdi.pki.store.CertStore`` (serving certificate rotated in a
  Secret) publishing its CA bundle to our APIService.

The ``Kube`` calls are synchronous; the async servers reach them through ``AsyncKube`` or
``asyncio.to_thread``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from cdi.api.cdiresource import DEFAULT_CA, Lifetime
from cdi.kube.client import (
    PVCS,
    SECRETS,
    SERVICES,
    SUBJECT_ACCESS_REVIEWS,
    AsyncKube,
    Kube,
    Resource,
)
from cdi.kube.errors import Conflict, KubeError
from cdi.pki.certs import KeyPair
from cdi.pki.store import CertStore, ServingCertConfig
from cdi.pki.upload import CA_BUNDLE_KEY, CONFIG_MAPS
from cdi.render.naming import upload_service_name
from cdi.upload.errors import UploadNotReady, UploadServerUnreachable
from cdi.upload.keys import KeyRing, SigningKey, StoreConflict, key_id
from cdi.upload.readiness import UploadServer
from cdi.upload.tokenapi import Decision, LookupFailed, RequestHeaderConfig, User, access_review

log = logging.getLogger(__name__)

API_SERVICES = Resource("apiregistration.k8s.io", "v1", "apiservices", "APIService", False)
AUTH_CONFIG_MAP = ("kube-system", "extension-apiserver-authentication")
MAX_PUBLISHED_KEYS = 3


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _key(data: Mapping[str, bytes], slot: str) -> SigningKey | None:
    pem, created = data.get(f"{slot}.key"), data.get(f"{slot}.created")
    if not pem or not created:
        return None
    key = SigningKey("", pem, dt.datetime.fromisoformat(created.decode()))
    return SigningKey(key_id(key.public_pem()), pem, key.created)


class SecretKeyStore:
    def __init__(self, kube: Kube, namespace: str, name: str = "cdi-api-signing-key") -> None:
        self.kube, self.namespace, self.name = kube, namespace, name

    def read(self) -> tuple[KeyRing | None, str | None]:
        secret = self.kube.get_or_none(SECRETS, self.name, self.namespace)
        if secret is None:
            return None, None
        data = _secret_data(secret)
        current = _key(data, "current")
        version = str(secret["metadata"]["resourceVersion"])
        return (KeyRing(current, _key(data, "previous")) if current else None), version

    def write(self, ring: KeyRing, version: str | None) -> None:
        data: dict[str, str] = {}
        for slot, key in (("current", ring.current), ("previous", ring.previous)):
            if key is not None:
                data[f"{slot}.key"] = _b64(key.private_pem)
                data[f"{slot}.created"] = _b64(key.created.isoformat().encode())
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data}
        try:
            if version is None:
                self.kube.create(SECRETS, body)
            else:
                meta["resourceVersion"] = version
                self.kube.replace(SECRETS, body)
        except Conflict as exc:
            raise StoreConflict(str(exc)) from exc

    def public_keys(self) -> dict[str, bytes]:
        ring, _ = self.read()
        return ring.public_keys() if ring else {}


def publish_public_keys(
    kube: Kube, namespace: str, name: str, ring: KeyRing, keep: int = MAX_PUBLISHED_KEYS
) -> None:
    """Write ``kid -> public PEM`` into the ConfigMap: the ring's keys first, then keys already
    published, up to ``keep``. Merging means a replica that read the ring just before another
    rotated it cannot unpublish the new key; old keys fall off as new ones arrive."""
    data = {f"{kid}.pem": pem.decode() for kid, pem in ring.public_keys().items()}
    current = kube.get_or_none(CONFIG_MAPS, name, namespace)
    for key, value in ((current or {}).get("data") or {}).items():
        if len(data) < keep and key.endswith(".pem"):
            data.setdefault(key, value)
    if current is not None and (current.get("data") or {}) == data:
        return
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
    if current is None:
        kube.create(CONFIG_MAPS, body)
    else:
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        kube.replace(CONFIG_MAPS, body)


def read_public_keys(kube: Kube, namespace: str, name: str) -> dict[str, bytes]:
    cm = kube.get_or_none(CONFIG_MAPS, name, namespace) or {}
    return {
        k.removesuffix(".pem"): str(v).encode()
        for k, v in (cm.get("data") or {}).items()
        if k.endswith(".pem")
    }


def read_upstream_credentials(
    kube: Kube, namespace: str, secret: str, config_map: str
) -> tuple[bytes, KeyPair] | None:
    """(upload servers' CA certificate, the proxy's client pair); None while the controller
    has not issued them yet."""
    bundle = ((kube.get_or_none(CONFIG_MAPS, config_map, namespace) or {}).get("data")) or {}
    data = _secret_data(kube.get_or_none(SECRETS, secret, namespace) or {})
    ca, cert, key = str(bundle.get(CA_BUNDLE_KEY) or ""), data.get("tls.crt"), data.get("tls.key")
    if not (ca and cert and key):
        return None
    return ca.encode(), KeyPair(cert, key)


class KubeAccessReviewer:
    def __init__(self, kube: AsyncKube) -> None:
        self.kube = kube

    async def review(self, user: User, namespace: str) -> Decision:
        try:
            out = await self.kube.create(SUBJECT_ACCESS_REVIEWS, access_review(user, namespace))
        except KubeError as exc:
            raise LookupFailed(f"SubjectAccessReview failed: {exc}") from exc
        result = out.get("status") or {}
        return Decision(bool(result.get("allowed")), str(result.get("reason") or ""))


class KubeUploadTargets:
    """PVC lookups (for the proxy: errors are 503s, as CDI's) and upload server URLs."""

    def __init__(self, kube: AsyncKube, port: int = 443, for_proxy: bool = True) -> None:
        self.kube, self.port, self.for_proxy = kube, port, for_proxy

    async def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return await self.kube.get_or_none(PVCS, name, namespace)
        except KubeError as exc:
            if self.for_proxy:
                raise UploadNotReady(str(exc)) from exc
            raise LookupFailed(str(exc)) from exc

    async def upload_server(self, namespace: str, pvc_name: str) -> UploadServer:
        """The Service's ClusterIP, verified as ``<svc>.<ns>.svc`` (no cluster DNS needed)."""
        name = upload_service_name(pvc_name)
        host = f"{name}.{namespace}.svc"
        try:
            svc = await self.kube.get_or_none(SERVICES, name, namespace)
        except KubeError as exc:
            raise UploadServerUnreachable(f"error in upload-proxy: {exc}") from exc
        ip = ((svc or {}).get("spec") or {}).get("clusterIP")
        if not ip or ip == "None":
            raise UploadServerUnreachable(
                f"error in upload-proxy: http: proxy error: dial tcp: lookup {host}: no such host"
            )
        return UploadServer(f"https://{ip}:{self.port}", host)


def _json_list(value: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if not value:
        return default
    parsed = json.loads(value)
    return tuple(str(v) for v in parsed) if isinstance(parsed, list) else default


def requestheader_settings(kube: Kube) -> tuple[bytes, RequestHeaderConfig]:
    """The requestheader CA bundle and settings the kube-apiserver publishes."""
    cm = kube.get(CONFIG_MAPS, AUTH_CONFIG_MAP[1], AUTH_CONFIG_MAP[0])
    data = cm.get("data") or {}
    ca = str(data.get("requestheader-client-ca-file") or "").encode()
    if not ca:
        raise RuntimeError("the kube-apiserver publishes no requestheader CA (no aggregation)")
    base = RequestHeaderConfig()
    config = RequestHeaderConfig(
        allowed_names=_json_list(data.get("requestheader-allowed-names"), ()),
        username_headers=_json_list(
            data.get("requestheader-username-headers"), base.username_headers
        ),
        group_headers=_json_list(data.get("requestheader-group-headers"), base.group_headers),
        extra_prefixes=_json_list(
            data.get("requestheader-extra-headers-prefix"), base.extra_prefixes
        ),
    )
    return ca, config


class ProxyCertStore(CertStore):
    """The upload proxy's serving certificate, its CA bundle published in the ConfigMap CDI
    names (``cdi-uploadproxy-signer-bundle``, key ``ca-bundle.crt``), which the controller
    copies into CDIConfig ``status.uploadProxyCA`` for ``cdi upload`` to trust. The
    controller's metrics certificate is kept the same way (``cdi.controller.metrics_serving``:
    ``cdi-controller-metrics-signer-bundle``, for Prometheus)."""

    def __init__(
        self,
        kube: Kube,
        config: ServingCertConfig,
        config_map: str,
        ca_life: Callable[[], Lifetime] = lambda: DEFAULT_CA,
    ) -> None:
        super().__init__(kube, config, ca_life)
        self.config_map = config_map

    def publish(self, ca_bundle: bytes) -> None:
        ns, data = self.config.namespace, {CA_BUNDLE_KEY: ca_bundle.decode()}
        current = self.kube.get_or_none(CONFIG_MAPS, self.config_map, ns)
        if current is not None and (current.get("data") or {}) == data:
            return
        meta: dict[str, Any] = {"name": self.config_map, "namespace": ns}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        try:
            if current is None:
                self.kube.create(CONFIG_MAPS, body)
            else:
                meta["resourceVersion"] = current["metadata"]["resourceVersion"]
                self.kube.replace(CONFIG_MAPS, body)
        except Conflict:
            return  # a replica wrote first; the next check publishes again if it differs


class ApiServiceCertStore(CertStore):
    """A serving certificate rotated in a Secret, its CA bundle written into our APIService
    so the kube-apiserver verifies us (no ``insecureSkipTLSVerify``)."""

    def __init__(
        self,
        kube: Kube,
        config: ServingCertConfig,
        api_service: str,
        ca_life: Callable[[], Lifetime] = lambda: DEFAULT_CA,
    ) -> None:
        super().__init__(kube, config, ca_life)
        self.api_service = api_service

    def publish(self, ca_bundle: bytes) -> None:
        encoded = _b64(ca_bundle)

        def ops_for(current: dict[str, Any]) -> list[Any]:
            if (current.get("spec") or {}).get("caBundle") == encoded:
                return []
            return [{"op": "add", "path": "/spec/caBundle", "value": encoded}]

        self._publish_to(API_SERVICES, self.api_service, ops_for)
