"""The ``cdi webhook`` process: the pure admission server wired to the cluster.

Three cluster-facing pieces, each through the one gateway (``cdi.kube.client``):

- ``KubeLookup``: the ``ClusterLookup`` the validation rules ask (PVCs, DataSources, the
  claim-adoption feature gate) answered with GETs, PVCs through the process's claim informer
  when it has one (``cdi.webhooks.claims``: absence from the synced cache is trusted, a claim
  present is read fresh), and the ``Authorizer`` that asks the API server (a
  SubjectAccessReview) whether the requester may read an object in another namespace;
- ``WebhookCertStore``: the CA and serving certificate live in one Secret
  (``cdi.pki.store.CertStore``), so every replica serves the same certificate; ``ensure``
  rotates it when ``cdi.pki.certs.plan_rotation`` says so (compare-and-swap on the Secret's
  resourceVersion, so two replicas never fork the CA) and writes the CA bundle into our
  Validating/MutatingWebhookConfigurations (compare-and-swap too, ``CertStore._publish_to``: a
  replica that loses the race re-reads and finds the bundle published, no crash);
- ``serve_webhook``: HTTPS with an ``SSLContext`` reloaded in place after a rotation (new
  handshakes use the new certificate), a periodic rotation check, graceful stop on SIGTERM;
  ``/healthz`` also on a plain-HTTP port of its own for the kubelet's probe;
- ``ApiServerTrust``: whom the webhook answers (security review finding N2). By default
  (``client_auth="certificate"``) the TLS layer requires a client certificate signed by the
  CA the API server's front proxy uses, published by the API server itself in ConfigMap
  ``kube-system/extension-apiserver-authentication`` (``requestheader-client-ca-file``), and
  ``cdi.webhooks.callers`` checks its CN against ``requestheader-allowed-names``; the API server
  presents its front-proxy client certificate to the webhook when its admission configuration
  says so (``docs/security.md``). ``client_ca_file``/``client_names`` name another CA and CNs
  instead. Both are read again at every rotation check. ``client_auth="network"`` asks for no
  certificate: only for a cluster whose API server cannot present one, with the NetworkPolicy
  of ``deploy/optional/`` in force.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import web

from cdi.api.cdiresource import DEFAULT_CA, Lifetime
from cdi.api.cloneauth import AccessCheck, access_review_body
from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig
from cdi.api.constants import CDICONFIG_NAME, GATE_CLAIM_ADOPTION
from cdi.api.requester import RequesterSigner
from cdi.api.tlsprofile import apply as apply_profile
from cdi.kube.client import (
    API_CONCURRENCY,
    CDI_CONFIGS,
    CONFIG_MAPS,
    DATA_SOURCES,
    DATAVOLUMES,
    MUTATING_WEBHOOKS,
    PVCS,
    SUBJECT_ACCESS_REVIEWS,
    VALIDATING_WEBHOOKS,
    Kube,
)
from cdi.kube.errors import KubeError
from cdi.kube.informer import keys_cache
from cdi.lifecycle import LogVerbosity, run_until_stopped
from cdi.pki.certs import Bundle
from cdi.pki.contexts import TLSFiles, required_client_context
from cdi.pki.profile import FollowedProfile, following
from cdi.pki.store import CALife, CertStore, ServingCertConfig, b64
from cdi.webhooks.callers import ApiServerCaller
from cdi.webhooks.claims import CachedClaims, ClaimCache
from cdi.webhooks.fairness import FairLookups
from cdi.webhooks.mutation import UserInfo
from cdi.webhooks.server import make_app, make_health_app
from cdi.webhooks.visibility import access_review

log = logging.getLogger(__name__)

AUTH_CONFIG_MAP = ("kube-system", "extension-apiserver-authentication")
CLIENT_AUTH_MODES = ("certificate", "network")


@dataclass(frozen=True)
class WebhookConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    namespace: str = "cdi"
    service: str = "cdi-webhook"
    cert_secret: str = "cdi-webhook-certs"
    extra_sans: tuple[str, ...] = ()
    validating_config: str = "cdi-datavolume-validator"
    mutating_config: str = "cdi-datavolume-mutator"
    cert_check_interval: float = 3600.0
    requester_key: bytes | None = None  # signs storage.requester.* (cdi.api.requester)
    client_auth: str = "certificate"  # or "network": no client certificate (NetworkPolicy)
    client_ca_file: Path | None = None  # None: the API server's requestheader CA
    client_names: tuple[str, ...] | None = None  # None: requestheader-allowed-names
    health_port: int = 0  # plain-HTTP /healthz for the kubelet; 0: none

    def serving_cert(self) -> ServingCertConfig:
        return ServingCertConfig(self.namespace, self.service, self.cert_secret, self.extra_sans)


class KubeLookup:
    """``claims``: the webhook's claim cache (None: every claim is read with a GET)."""

    def __init__(self, kube: Kube, claims: ClaimCache | None = None) -> None:
        self.kube = kube
        self.claims = CachedClaims(claims, self.fresh_pvc) if claims is not None else None

    def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self.claims is not None:
            return self.claims.get_pvc(namespace, name)
        return self.fresh_pvc(namespace, name)

    def fresh_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.kube.get_or_none(PVCS, name, namespace)

    def get_data_source(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return self.kube.get_or_none(DATA_SOURCES, name, namespace)
        except KubeError:
            return None  # the DataSource kind may not be served at all

    def claim_adoption_enabled(self) -> bool:
        found = self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME) or {}
        try:
            return CDIConfig.from_dict(found).gate(GATE_CLAIM_ADOPTION)
        except SchemaError:
            return False  # an unreadable CDIConfig turns no gate on

    def datavolumes_exist(self) -> bool:
        """Whether any DataVolume exists in the cluster (the CDI resource's uninstall check)."""
        listing = self.kube.list(DATAVOLUMES, limit=1)
        return bool(listing.get("items"))

    def allows(self, user: UserInfo, namespace: str, check: AccessCheck) -> bool:
        body = access_review_body(user, namespace, check)
        review = self.kube.create(SUBJECT_ACCESS_REVIEWS, body)
        return bool((review.get("status") or {}).get("allowed"))

    def can_read(
        self, user: UserInfo, namespace: str, group: str, resource: str, name: str
    ) -> bool:
        review = self.kube.create(
            SUBJECT_ACCESS_REVIEWS, access_review(user, namespace, group, resource, name)
        )
        return bool((review.get("status") or {}).get("allowed"))


class WebhookCertStore(CertStore):
    """The webhook's serving certificate (``CertStore``), its CA bundle written into our
    Validating/MutatingWebhookConfigurations so the API server verifies us."""

    def __init__(
        self,
        kube: Kube,
        config: WebhookConfig,
        ca_life: Callable[[], Lifetime] = lambda: DEFAULT_CA,
    ) -> None:
        super().__init__(kube, config.serving_cert(), ca_life)
        self.webhooks = config

    def publish(self, ca_bundle: bytes) -> None:
        encoded = b64(ca_bundle)
        for res, name in (
            (VALIDATING_WEBHOOKS, self.webhooks.validating_config),
            (MUTATING_WEBHOOKS, self.webhooks.mutating_config),
        ):
            self._publish_to(res, name, partial(_webhook_ops, encoded=encoded))


def _webhook_ops(current: dict[str, Any], encoded: str) -> list[Any]:
    ops = []
    for i, hook in enumerate(current.get("webhooks") or []):
        if (hook.get("clientConfig") or {}).get("caBundle") != encoded:
            path = f"/webhooks/{i}/clientConfig/caBundle"
            ops.append({"op": "add", "path": path, "value": encoded})
    return ops


class ClientTrustMissing(RuntimeError):
    """No CA to verify the API server's client certificate with (the message says where)."""


class ApiServerTrust:
    """The CA and CNs of the API server's client certificate, from ``config`` or as the API
    server publishes them (``AUTH_CONFIG_MAP``)."""

    def __init__(self, kube: Kube, config: WebhookConfig) -> None:
        self.kube = kube
        self.config = config

    def read(self) -> tuple[bytes, tuple[str, ...]]:
        if self.config.client_ca_file is not None:
            ca = self.config.client_ca_file.read_bytes()
            names: tuple[str, ...] = ()
        else:
            ca, names = self._published()
        if not ca.strip():
            raise ClientTrustMissing(
                f"{self.config.client_ca_file or '/'.join(AUTH_CONFIG_MAP)}: no client CA"
            )
        if self.config.client_names is not None:
            names = self.config.client_names
        return ca, names

    def _published(self) -> tuple[bytes, tuple[str, ...]]:
        cm = self.kube.get(CONFIG_MAPS, AUTH_CONFIG_MAP[1], AUTH_CONFIG_MAP[0])
        data = cm.get("data") or {}
        ca = str(data.get("requestheader-client-ca-file") or "").encode()
        try:
            names = json.loads(data.get("requestheader-allowed-names") or "[]")
        except ValueError:
            names = None
        if not isinstance(names, list):
            raise ClientTrustMissing(f"{'/'.join(AUTH_CONFIG_MAP)}: bad requestheader names")
        return ca, tuple(str(n) for n in names)


async def serve_webhook(kube: Kube, config: WebhookConfig) -> None:
    if config.client_auth not in CLIENT_AUTH_MODES:
        raise ValueError(f"client_auth must be one of {CLIENT_AUTH_MODES}")
    # as many cluster lookups in flight as the API client keeps connections (API_CONCURRENCY):
    # with 4, a burst of DataVolume creates queued here behind each other's PVC GETs
    pool = ThreadPoolExecutor(API_CONCURRENCY, thread_name_prefix="admission")
    loop = asyncio.get_running_loop()

    async def run_blocking(fn: Any, *args: Any) -> Any:
        return await loop.run_in_executor(pool, partial(fn, *args))

    # one CDIConfig read every 5 s: the TLS profile, logVerbosity and certConfig.ca
    ca_life, verbosity = CALife(), LogVerbosity()

    def took(config: CDIConfig) -> None:
        verbosity.apply(config)
        ca_life.took(config)

    profile = FollowedProfile(kube, on_config=took)
    first_profile = await profile.first()
    store = WebhookCertStore(kube, config, ca_life)
    bundle: Bundle = await run_blocking(store.ensure)
    trust = ApiServerTrust(kube, config) if config.client_auth == "certificate" else None
    client_ca, names = await run_blocking(trust.read) if trust else (None, ())
    caller = ApiServerCaller(names) if trust else None
    files = TLSFiles()
    ctx = required_client_context(bundle.serving, files, client_ca, first_profile)

    # the existing-claim check of every DataVolume create, answered from a claim informer
    claims = keys_cache(kube, PVCS)  # asked only whether a claim exists
    claims.start()
    lookup = KubeLookup(kube, claims)
    signer = RequesterSigner(config.requester_key) if config.requester_key else None
    lookups = FairLookups(run_blocking, API_CONCURRENCY)
    app = make_app(
        lookup, run_blocking, lookup, signer, lookup, caller, lookups, lookup.datavolumes_exist
    )
    runners = [web.AppRunner(app)]
    if config.health_port:
        runners.append(web.AppRunner(make_health_app()))
    for runner in runners:
        await runner.setup()
    await web.TCPSite(runners[0], config.host, config.port, ssl_context=ctx).start()
    if config.health_port:
        await web.TCPSite(runners[1], config.host, config.health_port).start()
    log.info(
        "serving admission webhooks on %s:%d (client certificates: %s)",
        config.host,
        config.port,
        f"required, CN in {list(names) or 'any'}" if caller else "not asked for",
    )

    async def rotate() -> None:
        nonlocal bundle, client_ca
        fresh: Bundle = await run_blocking(store.ensure)
        if fresh.serving != bundle.serving:
            files.load(ctx, fresh.serving)
            bundle = fresh
            log.info("serving the rotated certificate")
        if trust is not None and caller is not None:
            ca, allowed = await run_blocking(trust.read)
            if ca != client_ca:  # a new CA is added: handshakes verify against both
                ctx.load_verify_locations(cadata=ca.decode())
                client_ca = ca
                log.info("client CA changed: trusting the new one too")
            caller.update(allowed)

    try:
        async with following(profile, partial(apply_profile, ctx)):
            await run_until_stopped(
                lambda: ca_life.check_every(bundle, config.cert_check_interval), rotate
            )
    finally:
        claims.stop()
        for runner in runners:
            await runner.cleanup()
        files.close()
        pool.shutdown(wait=False)
