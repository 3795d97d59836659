"""Where and how the controller serves ``/metrics``: plain HTTP or TLS, always behind the
bearer-token guard (``cdi.controller.metrics_auth``).

With TLS (``--metrics-tls``, as ``deploy/`` runs it; CDI serves its metrics over HTTPS too):

- the serving certificate is kept, with its own CA, in Secret
  ``cdi-controller-metrics-server-cert`` by a ``cdi.pki.store.CertStore`` (the one the webhook,
  the token API and the upload proxy use: compare-and-swap on the Secret, so two replicas never
  fork the CA; rotated by ``cdi.pki.certs`` rules, checked every ``check_interval`` or a quarter
  of the CA rotation's stage if sooner), issued for the Service ``cdi-controller-metrics``. Its
  CA lives as the CDI resource's ``certConfig.ca`` says (CDIConfig's status carries it, read
  every 5 s with the TLS profile) and is replaced in stages: published beside the old one
  first, signing only a stage later, the old one dropped a stage after that. Its CA
  certificate alone is published in ConfigMap
  ``cdi-controller-metrics-signer-bundle`` (``ProxyCertStore``'s way, the upload proxy's), and
  Prometheus verifies it with that and the name (the ServiceMonitor's ``tlsConfig``,
  ``deploy/optional/monitoring.yaml``), never reading the Secret with the CA's key;
- CDIConfig's ``tlsSecurityProfile`` is followed (``cdi.pki.profile``, every 5 s) and applied to
  the live context, as the webhook and the token API do (asyncio TLS: every SSL object is made
  on the loop thread);
- the Secret is written by whichever replica needs it, a standby too, so this uses the
  unfenced client the manager hands in;
- a certificate that cannot be had (the API server unreachable, a conflict storm) never stops
  the controller: the server starts once it is had, asked again every ``retry`` seconds, and
  reconciling goes on meanwhile; a failed hourly check keeps the current certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from dataclasses import dataclass
from functools import partial

from aiohttp import web

from cdi.api.tlsprofile import apply as apply_profile
from cdi.controller.metrics import ControllerMetrics, Guard, serve_metrics
from cdi.kube.client import Kube
from cdi.kube.errors import KubeError
from cdi.pki.certs import Bundle
from cdi.pki.contexts import load_pair, serving_context
from cdi.pki.profile import FollowedProfile, following
from cdi.pki.store import CALife, CertStore, ServingCertConfig
from cdi.upload.kubestore import ProxyCertStore

log = logging.getLogger(__name__)

METRICS_SERVICE = "cdi-controller-metrics"
METRICS_CERT_SECRET = "cdi-controller-metrics-server-cert"
# the CA certificate alone (key ca-bundle.crt), for the ServiceMonitor's tlsConfig
METRICS_CA_BUNDLE = "cdi-controller-metrics-signer-bundle"
TICK = 5.0  # seconds between looks at the check's due time (no API call)


def metrics_cert_config(namespace: str) -> ServingCertConfig:
    return ServingCertConfig(namespace, METRICS_SERVICE, METRICS_CERT_SECRET)


@dataclass(frozen=True)
class MetricsServing:
    host: str = "0.0.0.0"
    port: int = 8080
    tls: ServingCertConfig | None = None  # None: plain HTTP
    retry: float = 5.0
    check_interval: float = 3600.0


class MetricsServer:
    def __init__(
        self, kube: Kube, metrics: ControllerMetrics, guard: Guard, serving: MetricsServing
    ) -> None:
        self.kube, self.metrics, self.guard, self.serving = kube, metrics, guard, serving
        self.runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self.ca_life = CALife()  # certConfig.ca, from the CDIConfig reads of the TLS profile

    async def start(self) -> None:
        """Plain HTTP: listening when this returns (a taken port fails here). TLS: in the
        background, once the certificate is had."""
        if self.serving.tls is None:
            await self._listen(None)
        else:
            self._task = asyncio.create_task(self._guarded(self.serving.tls), name="metrics")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.runner is not None:
            await self.runner.cleanup()

    async def _listen(self, ctx: ssl.SSLContext | None) -> None:
        s = self.serving
        self.runner = await serve_metrics(self.metrics, self.guard, s.host, s.port, ctx)
        log.info("serving /metrics on %s:%d (%s)", s.host, s.port, "TLS" if ctx else "HTTP")

    async def _guarded(self, tls: ServingCertConfig) -> None:
        """``_run``; anything it did not foresee is logged, never raised into the shutdown."""
        try:
            await self._run(tls)
        except Exception:
            log.exception("the metrics server stopped")

    async def _run(self, tls: ServingCertConfig) -> None:
        profile = FollowedProfile(self.kube, on_config=self.ca_life.took)
        first = await profile.first()
        # publishes the CA alone; certConfig.ca's lifetime, staged rotation (cdi.pki.certs)
        store = ProxyCertStore(self.kube, tls, METRICS_CA_BUNDLE, self.ca_life)
        bundle = await self._first_bundle(store)
        ctx = serving_context(bundle.serving, profile=first)
        await self._listen(ctx)
        async with following(profile, partial(apply_profile, ctx)):
            checked = time.monotonic()
            while True:  # a tick every few seconds: a new certConfig.ca shortens the wait
                every = self.ca_life.check_every(bundle, self.serving.check_interval)
                await asyncio.sleep(min(TICK, every))
                if time.monotonic() - checked >= every:
                    bundle = await self._refresh(store, bundle, ctx)
                    checked = time.monotonic()

    async def _first_bundle(self, store: CertStore) -> Bundle:
        while True:
            try:
                return await asyncio.to_thread(store.ensure)
            except (KubeError, RuntimeError) as exc:
                log.warning("no metrics certificate yet (%s); asking again", exc)
                await asyncio.sleep(self.serving.retry)

    async def _refresh(self, store: CertStore, bundle: Bundle, ctx: ssl.SSLContext) -> Bundle:
        try:
            fresh = await asyncio.to_thread(store.ensure)
        except (KubeError, RuntimeError) as exc:
            log.warning("the metrics certificate could not be checked: %s", exc)
            return bundle
        if fresh.serving != bundle.serving:
            load_pair(ctx, fresh.serving)
        return fresh
