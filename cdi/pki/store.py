"""A serving certificate kept in a Secret, so every replica of a server serves the same one.

``CertStore.ensure`` reads the Secret (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``,
``ca-previous.crt``), rotates the bundle when ``certs.plan_rotation`` says so (compare-and-swap
on the Secret's resourceVersion, so two replicas never fork the CA) and publishes the CA bundle
with ``publish``: nowhere here (the upload proxy: its clients reach it through an
Ingress/Route or trust the CA from the Secret); the webhook's store writes it into our
Validating/MutatingWebhookConfigurations (``cdi.admission.WebhookCertStore``), the token API's
into its APIService (``cdi.upload.kubestore.ApiServiceCertStore``).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from cdi.kube.client import SECRETS, Kube
from cdi.kube.errors import Conflict
from cdi.pki.certs import Bundle, KeyPair, rotate, service_names

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingCertConfig:
    """Where a server's certificate lives and the Service names it is issued for."""

    namespace: str
    service: str
    cert_secret: str
    extra_sans: tuple[str, ...] = ()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class CertStore:
    KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key", "ca-previous.crt")

    def __init__(self, kube: Kube, config: ServingCertConfig) -> None:
        self.kube = kube
        self.config = config
        self.names = service_names(config.service, config.namespace, config.extra_sans)

    def _read(self) -> tuple[Bundle | None, dict[str, Any] | None]:
        secret = self.kube.get_or_none(SECRETS, self.config.cert_secret, self.config.namespace)
        if secret is None:
            return None, None
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        if not all(k in data for k in self.KEYS[:4]):
            return None, secret
        bundle = Bundle(
            KeyPair(data["ca.crt"], data["ca.key"]),
            KeyPair(data["tls.crt"], data["tls.key"]),
            data.get("ca-previous.crt", b""),
        )
        return bundle, secret

    def _write(self, bundle: Bundle, secret: dict[str, Any] | None) -> None:
        values = (
            bundle.ca.cert_pem,
            bundle.ca.key_pem,
            bundle.serving.cert_pem,
            bundle.serving.key_pem,
            bundle.previous_ca_pem,
        )
        data = {k: b64(v) for k, v in zip(self.KEYS, values, strict=True)}
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": self.config.cert_secret, "namespace": self.config.namespace},
            "data": data,
        }
        if secret is None:
            self.kube.create(SECRETS, body)
        else:
            body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
            self.kube.replace(SECRETS, body)

    def ensure(self, now: dt.datetime | None = None) -> Bundle:
        """The current bundle, rotated if due, stored, and published (``publish``)."""
        for _ in range(5):
            bundle, secret = self._read()
            fresh = rotate(bundle, self.names, now or dt.datetime.now(dt.UTC))
            if fresh is None:
                assert bundle is not None
                self.publish(bundle.ca_bundle)
                return bundle
            try:
                self._write(fresh, secret)
            except Conflict:
                continue  # another replica rotated first: use theirs
            log.info("webhook certificate %s", "created" if bundle is None else "rotated")
            self.publish(fresh.ca_bundle)
            return fresh
        raise RuntimeError("could not store the webhook certificate (conflicts)")

    def publish(self, ca_bundle: bytes) -> None:
        """Make ``ca_bundle`` known to the clients that must verify us: here, nowhere."""
        return None
