"""A serving certificate kept in a Secret, so every replica of a server serves the same one.

``CertStore.ensure`` takes one step of rotation at a time (``cdi.pki.certs``: a new CA is staged
in the bundle before it signs, the old one dropped after) with the CA lifetime ``ca_life`` gives
(the CDI resource's ``certConfig.ca`` where the process knows it). It reads the Secret
(``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``,
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdi.api.cdiresource import DEFAULT_CA, Lifetime, lifetimes
from cdi.api.config import CDIConfig
from cdi.kube.client import JSON_PATCH, SECRETS, Kube, Resource
from cdi.kube.errors import Conflict, Invalid, KubeError, NotFound
from cdi.pki.certs import Bundle, KeyPair, plan_rotation, rotate, service_names, stage_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingCertConfig:
    """Where a server's certificate lives and the Service names it is issued for."""

    namespace: str
    service: str
    cert_secret: str
    extra_sans: tuple[str, ...] = ()


class CALife:
    """The CA lifetime in force in one process: the CDI resource's ``certConfig.ca`` as
    CDIConfig's status carries it, taken from the CDIConfig read the process makes anyway for
    its TLS profile (``took``: ``FollowedProfile``'s ``on_config``, every 5 s). A
    ``CertStore`` asks it (``ca_life``) at every check; ``check_every`` says how soon the next
    check is due."""

    def __init__(self) -> None:
        self.current = DEFAULT_CA

    def took(self, config: CDIConfig) -> None:
        self.current = lifetimes(config.cert_config).ca

    def __call__(self) -> Lifetime:
        return self.current

    def check_every(
        self, bundle: Bundle | None, interval: float, now: dt.datetime | None = None
    ) -> float:
        """``interval`` (the hourly check), or sooner: a quarter of the rotation's stage, so
        every replica serves a re-issued certificate long before the old CA leaves the
        bundle, and a quarter of what is left of the CA's life or of the serving
        certificate's (a short-lived CA from a certConfig since lifted: the certificate it
        signed ends with it, while the year-long CA staged beside it waits out its stage)."""
        stage = stage_of(self.current).total_seconds()
        left = interval * 4
        if bundle is not None:
            at = now or dt.datetime.now(dt.UTC)
            try:
                end = min(
                    bundle.ca.cert.not_valid_after_utc, bundle.serving.cert.not_valid_after_utc
                )
                left = (end - at).total_seconds()
            except ValueError:
                left = 0.0
        return max(1.0, min(interval, stage / 4, left / 4))


PUBLISH_ATTEMPTS = 5  # replicas racing to publish one CA settle in one or two


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class CertStore:
    KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key", "ca-previous.crt")

    def __init__(
        self,
        kube: Kube,
        config: ServingCertConfig,
        ca_life: Callable[[], Lifetime] = lambda: DEFAULT_CA,
    ) -> None:
        self.kube = kube
        self.config = config
        self.names = service_names(config.service, config.namespace, config.extra_sans)
        # the CA's lifetime in force (the CDI resource's certConfig.ca), asked at every check
        self.ca_life = ca_life

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
            at, life = now or dt.datetime.now(dt.UTC), self.ca_life()
            fresh = rotate(bundle, self.names, at, ca_life=life)
            if fresh is None:
                assert bundle is not None
                self.publish(bundle.ca_bundle)
                return bundle
            try:
                self._write(fresh, secret)
            except Conflict:
                continue  # another replica rotated first: use theirs
            step = "created" if bundle is None else plan_rotation(bundle, self.names, at, life)
            log.info("certificate %s/%s: %s", self.config.namespace, self.config.cert_secret, step)
            self.publish(fresh.ca_bundle)
            return fresh
        raise RuntimeError("could not store the webhook certificate (conflicts)")

    def publish(self, ca_bundle: bytes) -> None:
        """Make ``ca_bundle`` known to the clients that must verify us: here, nowhere."""
        return None

    def _publish_to(
        self, res: Resource, name: str, ops_for: Callable[[dict[str, Any]], list[Any]]
    ) -> None:
        """Compare-and-swap the CA bundle into ``name`` (``ops_for``: the JSON patch ops that
        put it into the object read, none when it is there). A replica starting beside us may
        patch between our read and our patch: the API server then fails the patch's ``test``
        of resourceVersion with 422 (not 409). Re-read and try again; a refusal while the
        object did not change is a real one and is raised."""
        refused: tuple[str, KubeError] | None = None  # the version a patch was refused at
        for _ in range(PUBLISH_ATTEMPTS):
            try:
                current = self.kube.get(res, name)
            except NotFound:
                log.warning("%s %s not found; CA bundle not published", res.kind, name)
                return
            rv = current["metadata"]["resourceVersion"]
            if refused is not None and refused[0] == rv:
                raise refused[1]  # nothing changed since: the patch itself is refused
            ops = ops_for(current)
            if not ops:
                return  # already published (by us or by a replica with the same CA)
            ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": rv})
            try:
                self.kube.patch(res, name, ops, content_type=JSON_PATCH)
                return
            except (Conflict, Invalid) as exc:
                refused = (rv, exc)
        raise RuntimeError(f"could not publish the CA bundle in {res.kind} {name} (conflicts)")
