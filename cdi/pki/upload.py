"""Certificates of the upload server pods: the CAs kept in Secrets, and one serving certificate
per upload pod, issued by the controller's upload flavour.

The upload proxy trusts only the CA in Secret ``cdi-uploadserver-ca`` and dials a server as
``cdi-upload-<pvc>.<ns>.svc``; the server trusts only client certificates from the CA in Secret
``cdi-uploadserver-client-ca`` (the proxy's, and a clone source's). So for every upload pod the
controller issues a serving certificate from the first CA for exactly that name, and hands the
pod the second CA's certificate (never its key) to verify clients with. They travel in one
Secret, ``<pod>-tls`` (``tls.crt``, ``tls.key``, ``ca.crt``), mounted into the pod as files.

``ensure_ca`` (a CA key pair in a Secret, created by the controller when absent) lives here
because both CAs and their keys are the controller's alone. The upload proxy, the component
users reach from outside the cluster, holds neither key (N5, ``docs/security.md``): the
controller issues the proxy's client certificate into Secret ``cdi-uploadserver-client-cert``
(``tls.crt``, ``tls.key``; the proxy may only read it) and publishes the server CA's
certificate alone in ConfigMap ``cdi-uploadserver-signer-bundle`` (``ca-bundle.crt``), CDI's
names, through ``ProxyCredentials``, and renews the certificate when 80 % of its life is gone.

A server certificate lives ``lifetime``; the pod is told to stop taking uploads before that
(``deadline``: 80 % of the lifetime, CDI's renew-before share), exits saying ``deadlinePassed``
and is re-created by the controller with a fresh certificate, so no server ever presents an
expired one.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from cdi.api.cdiresource import Lifetime, lifetimes
from cdi.api.config import CDIConfig
from cdi.kube.client import SECRETS, Kube, Resource
from cdi.kube.errors import Conflict
from cdi.pki.certs import RENEW_BEFORE, KeyPair, issue_client, issue_serving, new_ca
from cdi.render.upload_pod import UPLOAD_CLIENT_NAME

log = logging.getLogger(__name__)

SERVER_CA_SECRET = "cdi-uploadserver-ca"
CLIENT_CA_SECRET = "cdi-uploadserver-client-ca"
SERVER_CERT_LIFETIME = dt.timedelta(hours=24)
# The upload proxy's client certificate and the server CA's certificate, issued and published
# by the controller for the proxy to read (CDI's names).
PROXY_CLIENT_SECRET = "cdi-uploadserver-client-cert"
SERVER_CA_BUNDLE = "cdi-uploadserver-signer-bundle"
CA_BUNDLE_KEY = "ca-bundle.crt"
# the upload proxy's serving CA (CDI's name), for CDIConfig status.uploadProxyCA
PROXY_CA_BUNDLE = "cdi-uploadproxy-signer-bundle"
PROXY_CLIENT_LIFETIME = dt.timedelta(days=30)
ISSUED_EARLY = dt.timedelta(minutes=5)  # certs.py: valid from 5 minutes before issuing
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def ensure_ca(kube: Kube, namespace: str, name: str, common_name: str) -> KeyPair:
    """The CA kept in Secret ``namespace/name`` (``tls.crt``/``tls.key``), created if absent."""
    for _ in range(3):
        secret = kube.get_or_none(SECRETS, name, namespace)
        data = secret_data(secret or {})
        if data.get("tls.crt") and data.get("tls.key"):
            return KeyPair(data["tls.crt"], data["tls.key"])
        ca = new_ca(common_name, dt.datetime.now(dt.UTC))
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": meta,
            "data": {"tls.crt": _b64(ca.cert_pem), "tls.key": _b64(ca.key_pem)},
        }
        try:
            if secret is None:
                kube.create(SECRETS, body)
            else:
                meta["resourceVersion"] = secret["metadata"]["resourceVersion"]
                kube.replace(SECRETS, body)
            log.info("created CA %s/%s", namespace, name)
            return ca
        except Conflict:
            continue  # someone else created it first: use theirs
    raise RuntimeError(f"could not store the CA {namespace}/{name} (conflicts)")


@dataclass(frozen=True)
class ServerCredentials:
    """What one upload pod gets: its serving pair, the client CA certificate, its deadline."""

    server: KeyPair
    client_ca_pem: bytes
    deadline: dt.datetime

    def secret_data(self) -> dict[str, str]:
        """The ``<pod>-tls`` Secret's ``data`` (base64, as the API wants it)."""
        return {
            "tls.crt": _b64(self.server.cert_pem),
            "tls.key": _b64(self.server.key_pem),
            "ca.crt": _b64(self.client_ca_pem),
        }


def server_name(service: str, namespace: str) -> str:
    """The name the proxy verifies: ``cdi-upload-<pvc>.<ns>.svc``."""
    return f"{service}.{namespace}.svc"


def deadline_for(
    now: dt.datetime, lifetime: dt.timedelta, renew_before: dt.timedelta | None = None
) -> dt.datetime:
    """When the server stops taking uploads: ``renew_before`` before the certificate ends (the
    CDI resource's ``certConfig.server.renewBefore``), else with ``RENEW_BEFORE`` of the
    lifetime left."""
    if renew_before is None:
        return now + lifetime * (1 - RENEW_BEFORE)
    return now + lifetime - renew_before


def issue_server_credentials(
    server_ca: KeyPair,
    client_ca_pem: bytes,
    service: str,
    namespace: str,
    now: dt.datetime,
    lifetime: dt.timedelta = SERVER_CERT_LIFETIME,
    renew_before: dt.timedelta | None = None,
) -> ServerCredentials:
    """A fresh serving certificate for ``<service>.<namespace>.svc`` from ``server_ca``,
    valid ``lifetime``, taken out of service ``renew_before`` its end (``deadline_for``)."""
    # The Service name first: it becomes the CN (at most 64 characters; a DNS label is 63),
    # where ``<svc>.<ns>.svc`` can be longer. The proxy verifies the SAN ``<svc>.<ns>.svc``.
    names = (service, server_name(service, namespace))
    pair = issue_serving(server_ca, names, now, lifetime)
    return ServerCredentials(pair, client_ca_pem, deadline_for(now, lifetime, renew_before))


def server_lifetime(config: CDIConfig, default: dt.timedelta) -> Lifetime:
    """An upload server certificate's lifetime: the CDI resource's ``certConfig.server`` (as
    CDIConfig's status carries it), else ``default`` (the controller's flag) renewed with
    ``RENEW_BEFORE`` of it left."""
    return lifetimes(config.cert_config, Lifetime(default, default * RENEW_BEFORE)).upload_server


def client_lifetime(config: CDIConfig, default: dt.timedelta) -> dt.timedelta:
    """A clone source's client certificate lifetime: ``certConfig.client``'s, else ``default``."""
    if config.cert_config.client is None:
        return default
    return lifetimes(config.cert_config).client.duration


class UploadCAs:
    """Both CAs, read (or created) through the gateway; cached once read, since a CA's key pair
    never changes under the same Secret."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self._server: KeyPair | None = None
        self._client: KeyPair | None = None

    def load(self) -> tuple[KeyPair, bytes]:
        """(server CA pair, client CA certificate PEM); blocking: call on a worker thread."""
        if self._server is None:
            self._server = ensure_ca(self.kube, self.namespace, SERVER_CA_SECRET, SERVER_CA_SECRET)
        return self._server, self.client_ca().cert_pem

    def client_ca(self) -> KeyPair:
        """The client CA's key pair (the controller issues the proxy's and clone sources'
        client certificates with it); blocking."""
        if self._client is None:
            self._client = ensure_ca(self.kube, self.namespace, CLIENT_CA_SECRET, CLIENT_CA_SECRET)
        return self._client


def _due(
    cert_pem: bytes, issuer: KeyPair, now: dt.datetime, lifetime: Lifetime | None = None
) -> bool:
    """A certificate to (re-)issue: unreadable, not from ``issuer``, longer-lived than
    ``lifetime`` asks (the CDI resource's ``certConfig.client`` shortened it), or due:
    ``lifetime``'s renewBefore before its end, else with less than ``RENEW_BEFORE`` of its life
    left."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if cert.issuer != issuer.cert.subject:
        return True
    if lifetime is None:
        return now >= end - (end - start) * RENEW_BEFORE
    # longer than asked: issued before a shorter certConfig (shorter may be the CA's end)
    longer = end - start - ISSUED_EARLY > lifetime.duration + dt.timedelta(seconds=1)
    return longer or lifetime.due(start, end, now)


def _store(kube: Kube, resource: Resource, body: dict[str, Any], found: Any) -> None:
    """Create ``body``, or replace ``found`` with it; a conflict means another writer (a
    previous leader) got there first, and the next check looks again."""
    try:
        if found is None:
            kube.create(resource, body)
        else:
            body["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
            kube.replace(resource, body)
    except Conflict:
        name = body["metadata"]["name"]
        log.info("%s %s changed under us; checked again next time", resource.kind, name)


class ProxyCredentials:
    """What the upload proxy needs for mutual TLS to upload servers, kept by the controller:
    its client certificate (Secret ``PROXY_CLIENT_SECRET``) and the server CA's certificate
    (ConfigMap ``SERVER_CA_BUNDLE``). ``ensure`` is idempotent and cheap when nothing is due;
    blocking: call it on a worker thread."""

    def __init__(self, cas: UploadCAs, lifetime: dt.timedelta = PROXY_CLIENT_LIFETIME) -> None:
        self.cas, self.lifetime = cas, lifetime

    def ensure(self, now: dt.datetime, client: Lifetime | None = None) -> bool:
        """Publish and issue what is due; whether anything was written. ``client``: the CDI
        resource's ``certConfig.client`` (None: ``lifetime``, renewed at 80 %)."""
        server_ca, _ = self.cas.load()
        published = self._publish_server_ca(server_ca.cert_pem.decode())
        return self._issue_client(now, client) or published

    def _publish_server_ca(self, pem: str) -> bool:
        kube, ns = self.cas.kube, self.cas.namespace
        found = kube.get_or_none(CONFIG_MAPS, SERVER_CA_BUNDLE, ns)
        if ((found or {}).get("data") or {}).get(CA_BUNDLE_KEY) == pem:
            return False
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": SERVER_CA_BUNDLE, "namespace": ns},
            "data": {CA_BUNDLE_KEY: pem},
        }
        _store(kube, CONFIG_MAPS, body, found)
        return True

    def _issue_client(self, now: dt.datetime, client: Lifetime | None) -> bool:
        kube, ns, client_ca = self.cas.kube, self.cas.namespace, self.cas.client_ca()
        found = kube.get_or_none(SECRETS, PROXY_CLIENT_SECRET, ns)
        if not _due(secret_data(found or {}).get("tls.crt", b""), client_ca, now, client):
            return False
        duration = client.duration if client is not None else self.lifetime
        pair = issue_client(client_ca, UPLOAD_CLIENT_NAME, now, duration)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": PROXY_CLIENT_SECRET, "namespace": ns},
            "data": {"tls.crt": _b64(pair.cert_pem), "tls.key": _b64(pair.key_pem)},
        }
        _store(kube, SECRETS, body, found)
        log.info("issued the upload proxy's client certificate %s/%s", ns, PROXY_CLIENT_SECRET)
        return True
