"""Certificates of the upload server pods: the CAs kept in Secrets, and one serving certificate
per upload pod, issued by the controller's upload flavour.

The upload proxy trusts the CAs published from Secret ``cdi-uploadserver-ca`` and dials a
server as ``cdi-upload-<pvc>.<ns>.svc``; the server trusts only client certificates from the
CAs in Secret ``cdi-uploadserver-client-ca`` (the proxy's, and a clone source's). So for every
upload pod the controller issues a serving certificate from the first CA's signer for exactly
that name, and hands the pod the second CA's certificates (never a key) to verify clients with.
They travel in one Secret, ``<pod>-tls`` (``tls.crt``, ``tls.key``, ``ca.crt``), mounted into
the pod as files.

Each CA is a ``cdi.pki.uploadca.CAState`` in its Secret (signer, staged, previous), rotated in
stages by ``ProxyCredentials.ensure`` on the leading controller's check; it lives here because
both CAs and their keys are the controller's alone. The upload proxy, the component users reach
from outside the cluster, holds neither key (N5, ``docs/security.md``): the controller issues the
proxy's client certificate into Secret ``cdi-uploadserver-client-cert`` (``tls.crt``,
``tls.key``; the proxy may only read it) and publishes the server CAs' certificates in ConfigMap
``cdi-uploadserver-signer-bundle`` (``ca-bundle.crt``), CDI's names, and renews the certificate
when 80 % of its life is gone or its CA switched.

A server certificate lives ``life``; the pod is told to stop taking uploads before that
(``uploadca.server_deadline``: renewBefore before its end, and before the client CAs it trusts
are switched away from), exits saying ``deadlinePassed`` and is re-created by the controller
with a fresh certificate, so no server ever presents an expired one.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from cdi.api.cdiresource import DEFAULT_CA, DEFAULT_UPLOAD_SERVER, Lifetime, lifetimes
from cdi.api.config import CDIConfig
from cdi.kube.client import SECRETS, Kube, Resource
from cdi.kube.errors import Conflict
from cdi.pki.certs import ISSUED_EARLY, RENEW_BEFORE, KeyPair, _issued_by, issue_client, new_ca
from cdi.pki.uploadca import (
    CAState,
    from_secret_data,
    issue_upload_server,
    next_check,
    rotate_client_ca,
    rotate_server_ca,
    server_deadline,
    to_secret_data,
)
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
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _ca_secret(namespace: str, name: str, state: CAState) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: _b64(v) for k, v in to_secret_data(state).items()},
    }


def read_ca_state(kube: Kube, namespace: str, name: str) -> tuple[CAState | None, Any]:
    """The CA under rotation kept in Secret ``namespace/name`` (``cdi.pki.uploadca``'s keys
    beside ``tls.crt``/``tls.key``), and the Secret as read (None: absent)."""
    secret = kube.get_or_none(SECRETS, name, namespace)
    return from_secret_data(secret_data(secret or {})), secret


def store_ca_state(
    kube: Kube, namespace: str, name: str, state: CAState, found: Mapping[str, Any] | None
) -> bool:
    """Write ``state`` over ``found`` (compare-and-swap on its resourceVersion, so two
    controllers never fork a CA); False when someone else wrote it first."""
    return _store(kube, SECRETS, _ca_secret(namespace, name, state), found)


def ensure_ca_state(kube: Kube, namespace: str, name: str) -> CAState:
    """The CA kept in Secret ``namespace/name``, created if absent or unreadable (the
    rotation, ``ProxyCredentials.ensure``, replaces an expired one)."""
    for _ in range(3):
        state, found = read_ca_state(kube, namespace, name)
        if state is not None:
            return state
        fresh = CAState(new_ca(name, dt.datetime.now(dt.UTC)))
        if store_ca_state(kube, namespace, name, fresh, found):
            log.info("created CA %s/%s", namespace, name)
            return fresh
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


def issue_server_credentials(
    server_ca: CAState,
    client_ca: CAState,
    service: str,
    namespace: str,
    now: dt.datetime,
    life: Lifetime = DEFAULT_UPLOAD_SERVER,
    ca_life: Lifetime = DEFAULT_CA,
) -> ServerCredentials:
    """A fresh serving certificate for ``<service>.<namespace>.svc`` from the server CA's
    signer, valid ``life`` (or to the CA's end), with every client CA trusted now; taken out of
    service at ``uploadca.server_deadline``: ``life``'s renewBefore before its end, and before
    the client CAs it trusts are switched away from."""
    # The Service name first: it becomes the CN (at most 64 characters; a DNS label is 63),
    # where ``<svc>.<ns>.svc`` can be longer. The proxy verifies the SAN ``<svc>.<ns>.svc``.
    names = (service, server_name(service, namespace))
    pair = issue_upload_server(server_ca, names, now, life)
    trust = client_ca.trust
    return ServerCredentials(pair, trust, server_deadline(pair, client_ca, life, ca_life))


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
    """Both CAs under rotation, read (or created) through the gateway at every use: the leading
    controller's rotation (``ProxyCredentials.ensure``) changes them, and a pod's certificate
    must come from the signer of the moment. Blocking: call on a worker thread."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace

    def load(self) -> tuple[CAState, CAState]:
        """(server CA, client CA)."""
        return self.server(), self.client()

    def server(self) -> CAState:
        return ensure_ca_state(self.kube, self.namespace, SERVER_CA_SECRET)

    def client(self) -> CAState:
        return ensure_ca_state(self.kube, self.namespace, CLIENT_CA_SECRET)


def _due(
    cert_pem: bytes, issuer: KeyPair, now: dt.datetime, lifetime: Lifetime | None = None
) -> bool:
    """A certificate to (re-)issue: unreadable, not signed by ``issuer`` (a switched CA has
    the old one's name: the signature tells), longer-lived than ``lifetime`` asks (the CDI
    resource's ``certConfig.client`` shortened it), or due: ``lifetime``'s renewBefore before
    its end, else with less than ``RENEW_BEFORE`` of its life left."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if not _issued_by(cert, issuer.cert):
        return True
    if lifetime is None:
        return now >= end - (end - start) * RENEW_BEFORE
    # longer than asked: issued before a shorter certConfig (shorter may be the CA's end)
    longer = end - start - ISSUED_EARLY > lifetime.duration + dt.timedelta(seconds=1)
    return longer or lifetime.due(start, end, now)


def _store(kube: Kube, resource: Resource, body: dict[str, Any], found: Any) -> bool:
    """Create ``body``, or replace ``found`` with it; False on a conflict: another writer (a
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
        return False
    return True


@dataclass(frozen=True)
class UploadLifetimes:
    """What the upload CAs' rotation follows: ``certConfig.ca`` (both CAs), the longest an
    upload server's certificate lives (``certConfig.server``, else the controller's flag) and
    ``certConfig.client`` (None: the proxy's certificate lives ``PROXY_CLIENT_LIFETIME``)."""

    ca: Lifetime = DEFAULT_CA
    upload_server: Lifetime = DEFAULT_UPLOAD_SERVER
    client: Lifetime | None = None


class ProxyCredentials:
    """The upload CAs' rotation and what the upload proxy needs for mutual TLS to upload
    servers, kept by the leading controller: one step of each CA's rotation
    (``cdi.pki.uploadca``), the server CA's trust published (ConfigMap ``SERVER_CA_BUNDLE``)
    and the proxy's client certificate from the client CA's signer (Secret
    ``PROXY_CLIENT_SECRET``). ``ensure`` is idempotent and cheap when nothing is due;
    blocking: call it on a worker thread."""

    def __init__(self, cas: UploadCAs, lifetime: dt.timedelta = PROXY_CLIENT_LIFETIME) -> None:
        self.cas, self.lifetime = cas, lifetime

    def ensure(
        self,
        now: dt.datetime,
        lives: UploadLifetimes = UploadLifetimes(),
        live_trust: Callable[[], Iterable[Collection[str]]] = lambda: (),
        interval: dt.timedelta = dt.timedelta(minutes=10),
    ) -> dt.timedelta:
        """Take what step is due; how soon to check again. ``live_trust``: the fingerprints of
        the client CAs each live upload pod trusts (asked only when the client CA's switch
        waits on them)."""
        client_life = lives.client or Lifetime(self.lifetime, self.lifetime * RENEW_BEFORE)
        server = self._rotate(
            SERVER_CA_SECRET,
            lambda state: rotate_server_ca(state, now, lives.ca, lives.upload_server),
        )
        client = self._rotate(
            CLIENT_CA_SECRET,
            lambda state: rotate_client_ca(
                state, now, lives.ca, _lazy(live_trust), client_life, CLIENT_CA_SECRET
            ),
        )
        self._publish_server_ca(server.trust.decode())
        self._issue_client(now, client.signer, lives.client)
        return next_check((server, client), now, lives.ca, interval)

    def _rotate(self, name: str, step: Callable[[CAState | None], CAState | None]) -> CAState:
        kube, ns = self.cas.kube, self.cas.namespace
        state, found = read_ca_state(kube, ns, name)
        taken = step(state)
        if taken is None and state is not None:
            return state
        if taken is not None and store_ca_state(kube, ns, name, taken, found):
            log.info("upload CA %s/%s: %s", ns, name, _what(state, taken))
            return taken
        return ensure_ca_state(kube, ns, name)  # another writer's: checked again next time

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

    def _issue_client(self, now: dt.datetime, signer: KeyPair, client: Lifetime | None) -> bool:
        kube, ns = self.cas.kube, self.cas.namespace
        found = kube.get_or_none(SECRETS, PROXY_CLIENT_SECRET, ns)
        if not _due(secret_data(found or {}).get("tls.crt", b""), signer, now, client):
            return False
        duration = client.duration if client is not None else self.lifetime
        pair = issue_client(signer, UPLOAD_CLIENT_NAME, now, duration)
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


def _lazy(source: Callable[[], Iterable[Collection[str]]]) -> Iterator[Collection[str]]:
    """``source()``'s items, asked for only when iterated (the pods are listed only when the
    client CA's switch waits on them)."""
    yield from source()


def _what(before: CAState | None, after: CAState) -> str:
    if before is not None and before.signer != after.signer and after.previous_pem:
        return f"switched to the staged CA (the old one trusted until {after.previous_until})"
    if before is None or before.signer != after.signer:
        return "created (none, or an expired one, was there)"
    if after.staged is not None and before.staged is None:
        return "new CA staged (trusted, signing nothing yet)"
    return "the previous CA dropped from the trust"
