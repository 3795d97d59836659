"""The ``cdi uploadproxy`` and ``cdi upload-apiserver`` processes: the pure apps wired to the
cluster, TLS from certificates our code generates, periodic rotation, graceful SIGTERM.

Both serve HTTPS (the token API with aiohttp; the proxy with ``proxyserver.UploadProxy``, a
thread per connection on blocking TLS sockets, so upload bytes never cross the event loop)
with a serving certificate kept (and rotated) in a Secret by a ``cdi.pki.store.CertStore``;
the token API publishes its CA bundle into its APIService, the proxy nowhere.
Every ``check_interval`` seconds each process re-runs its rotations and reloads changed key
pairs into the live ``SSLContext`` objects (new handshakes use them):

- the token API: the serving certificate, and the signing ring (``keys.ensure_ring``: a new
  key after ``key_rotation``; the previous key stays valid) whose public keys it publishes;
- the proxy: its serving certificate, and its side of the mutual TLS to upload servers: the
  client certificate and the servers' CA certificate the controller issues and publishes
  (Secret ``cdi-uploadserver-client-cert``, ConfigMap ``cdi-uploadserver-signer-bundle``,
  ``cdi.pki.upload.ProxyCredentials``), reloaded when the controller renews them. The
  proxy parses untrusted HTTP from outside the cluster, so it holds no CA key and may only read
  these two objects (N5, ``docs/security.md``); it waits for them before it serves.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from aiohttp import web
from cryptography import x509

from cdi.api.config import CDIConfig
from cdi.api.tlsprofile import TLSProfile
from cdi.api.tlsprofile import apply as apply_profile
from cdi.kube.client import AsyncKube, Kube
from cdi.kube.errors import KubeError
from cdi.lifecycle import LogVerbosity, run_until_stopped
from cdi.pki.certs import Bundle, KeyPair
from cdi.pki.contexts import load_pair, serving_context, upstream_context
from cdi.pki.profile import FollowedProfile, following
from cdi.pki.store import CALife, CertStore, ServingCertConfig
from cdi.pki.upload import PROXY_CA_BUNDLE, PROXY_CLIENT_SECRET, SERVER_CA_BUNDLE
from cdi.upload.apiserver import make_api_app
from cdi.upload.errors import UploadNotReady
from cdi.upload.keys import KeyRing, ensure_ring
from cdi.upload.kubestore import (
    ApiServiceCertStore,
    KubeAccessReviewer,
    KubeUploadTargets,
    ProxyCertStore,
    SecretKeyStore,
    publish_public_keys,
    read_public_keys,
    read_upstream_credentials,
    requestheader_settings,
)
from cdi.upload.proxy import ProxyConfig
from cdi.upload.proxyserver import UploadProxy
from cdi.upload.token import Verifier
from cdi.upload.tokenapi import RequestHeaderConfig, TokenApi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadPlaneConfig:
    """Shared by both processes: where the Secrets live and what they are called."""

    host: str = "0.0.0.0"
    port: int = 8443
    namespace: str = "cdi"
    extra_sans: tuple[str, ...] = ()
    signing_secret: str = "cdi-api-signing-key"
    public_keys_config_map: str = "cdi-api-signing-public-keys"
    check_interval: float = 3600.0


@dataclass(frozen=True)
class ApiServerConfig:
    plane: UploadPlaneConfig = UploadPlaneConfig()
    service: str = "cdi-api"
    cert_secret: str = "cdi-apiserver-server-cert"
    api_service: str = "v1beta1.upload.cdi.kubevirt.io"
    key_rotation: dt.timedelta = dt.timedelta(days=7)
    requestheader_ca: bytes = b""  # empty: from kube-system/extension-apiserver-authentication
    requestheader: RequestHeaderConfig | None = None


@dataclass(frozen=True)
class UploadProxyConfig:
    plane: UploadPlaneConfig = UploadPlaneConfig()
    service: str = "cdi-uploadproxy"
    cert_secret: str = "cdi-uploadproxy-server-cert"
    client_cert_secret: str = PROXY_CLIENT_SECRET  # issued by the controller; read only
    server_ca_config_map: str = SERVER_CA_BUNDLE  # the upload servers' CA certificate alone
    ca_config_map: str = PROXY_CA_BUNDLE  # where this proxy publishes its own serving CA
    credentials_poll: float = 2.0  # s between looks while the controller has not issued them
    upload_server_port: int = 443
    proxy: ProxyConfig = field(default_factory=ProxyConfig)


def _cert_config(plane: UploadPlaneConfig, service: str, secret: str) -> ServingCertConfig:
    return ServingCertConfig(plane.namespace, service, secret, plane.extra_sans)


def _followed(kube: Kube) -> tuple[FollowedProfile, CALife]:
    """One CDIConfig read every 5 s for the TLS profile, logVerbosity and certConfig.ca."""
    ca_life, verbosity = CALife(), LogVerbosity()

    def took(config: CDIConfig) -> None:
        verbosity.apply(config)
        ca_life.took(config)

    return FollowedProfile(kube, on_config=took), ca_life


async def _serve(
    app: web.Application,
    plane: UploadPlaneConfig,
    ctx: ssl.SSLContext,
    periodic: Callable[[], Awaitable[None]],
    interval: Callable[[], float],
) -> None:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, plane.host, plane.port, ssl_context=ctx).start()
    log.info("serving on %s:%d", plane.host, plane.port)
    try:
        await run_until_stopped(interval, periodic)
    finally:
        await runner.cleanup()


class _ServingCert:
    """A serving key pair from a ``CertStore``, reloaded into ``ctx`` when rotated."""

    def __init__(self, store: CertStore) -> None:
        self.store = store
        self.bundle: Bundle | None = None

    async def refresh(self, ctx: ssl.SSLContext | None = None) -> KeyPair:
        fresh: Bundle = await asyncio.to_thread(self.store.ensure)
        if ctx is not None and (self.bundle is None or fresh.serving != self.bundle.serving):
            load_pair(ctx, fresh.serving)
        self.bundle = fresh
        return fresh.serving


async def serve_upload_api(kube: Kube, config: ApiServerConfig) -> None:
    plane = config.plane
    store = SecretKeyStore(kube, plane.namespace, plane.signing_secret)
    ring_holder: list[KeyRing] = []

    async def rotate_ring() -> KeyRing:
        now = dt.datetime.now(dt.UTC)
        ring = await asyncio.to_thread(ensure_ring, store, now, config.key_rotation)
        await asyncio.to_thread(
            publish_public_keys, kube, plane.namespace, plane.public_keys_config_map, ring
        )
        ring_holder[:] = [ring]
        return ring

    async def current_ring() -> KeyRing:
        return ring_holder[0] if ring_holder else await rotate_ring()

    ca, requestheader = config.requestheader_ca, config.requestheader
    if not ca or requestheader is None:
        ca_found, rh_found = await asyncio.to_thread(requestheader_settings, kube)
        ca, requestheader = ca or ca_found, requestheader or rh_found
    await rotate_ring()
    profile, ca_life = _followed(kube)
    first_profile = await profile.first()
    cert_store = ApiServiceCertStore(
        kube, _cert_config(plane, config.service, config.cert_secret), config.api_service, ca_life
    )
    serving = _ServingCert(cert_store)
    ctx = serving_context(await serving.refresh(), client_ca=ca, profile=first_profile)
    async_kube = AsyncKube(kube)
    targets = KubeUploadTargets(async_kube, for_proxy=False)
    api = TokenApi(KubeAccessReviewer(async_kube), targets, current_ring)

    async def periodic() -> None:
        await rotate_ring()
        await serving.refresh(ctx)

    try:
        async with following(profile, partial(apply_profile, ctx)):

            def every() -> float:
                return ca_life.check_every(serving.bundle, plane.check_interval)

            await _serve(make_api_app(api, requestheader), plane, ctx, periodic, every)
    finally:
        async_kube.close()


class _Upstream:
    """The proxy's side of mutual TLS to upload servers, read from what the controller keeps;
    a new context whenever it changes (renewed certificate)."""

    def __init__(self, kube: Kube, config: UploadProxyConfig) -> None:
        self.kube, self.config = kube, config
        self.seen: tuple[bytes, KeyPair] | None = None
        self.ends: dt.datetime | None = None  # of what ``seen`` holds (``check_every``)
        self._lock = threading.Lock()

    def _took(self, fresh: tuple[bytes, KeyPair]) -> ssl.SSLContext:
        """Keep ``fresh`` as seen, with when it ends: the client certificate, or the
        latest-ending CA in the bundle, whichever ends first (None: unreadable)."""
        self.seen = fresh
        try:
            cas = x509.load_pem_x509_certificates(fresh[0])
            self.ends = min(
                fresh[1].cert.not_valid_after_utc, max(c.not_valid_after_utc for c in cas)
            )
        except ValueError:
            self.ends = None
        return upstream_context(*fresh)

    def _read(self) -> tuple[bytes, KeyPair] | None:
        c = self.config
        return read_upstream_credentials(
            self.kube, c.plane.namespace, c.client_cert_secret, c.server_ca_config_map
        )

    async def first(self) -> ssl.SSLContext:
        """The first context: waits until the controller has issued the credentials."""
        while True:
            try:
                fresh = await asyncio.to_thread(self._read)
            except KubeError as exc:
                log.warning("the upload client credentials cannot be read: %s", exc)
                fresh = None
            if fresh is not None:
                return self._took(fresh)
            log.info(
                "waiting for the controller to issue %s and publish %s",
                self.config.client_cert_secret,
                self.config.server_ca_config_map,
            )
            await asyncio.sleep(self.config.credentials_poll)

    async def changed(self) -> ssl.SSLContext | None:
        """A context for renewed credentials; None when they are unchanged (or unreadable:
        the current ones stay in use)."""
        return await asyncio.to_thread(self.changed_now)

    def changed_now(self) -> ssl.SSLContext | None:
        """``changed``, blocking: also asked by a connection thread whose upload server's
        certificate did not verify (``Relay.refresh``)."""
        try:
            fresh = self._read()
        except KubeError as exc:
            log.warning("the upload client credentials cannot be read: %s", exc)
            return None
        with self._lock:
            if fresh is None or fresh == self.seen:
                return None
            return self._took(fresh)

    def check_every(self, interval: float) -> float:
        """``interval``, or a quarter of what is left of the client certificate or of the
        latest-ending CA in the bundle, whichever ends first: a short-lived upload CA (a
        ``certConfig.ca`` of minutes, or one left by a lifted ``certConfig``) is switched
        within its last call, and this process must have re-read the bundle by then."""
        if self.ends is None:
            return interval
        left = (self.ends - dt.datetime.now(dt.UTC)).total_seconds()
        return max(1.0, min(interval, left / 4))


async def serve_upload_proxy(kube: Kube, config: UploadProxyConfig) -> None:
    plane = config.plane
    credentials = _Upstream(kube, config)
    upstream = await credentials.first()
    profile, ca_life = _followed(kube)
    first_profile = await profile.first()
    cert_store = ProxyCertStore(
        kube, _cert_config(plane, config.service, config.cert_secret), config.ca_config_map, ca_life
    )
    serving = _ServingCert(cert_store)
    ctx = serving_context(await serving.refresh(), profile=first_profile)
    async_kube = AsyncKube(kube)

    async def keys() -> Mapping[str, bytes]:
        try:
            return await asyncio.to_thread(
                read_public_keys, kube, plane.namespace, plane.public_keys_config_map
            )
        except KubeError as exc:
            raise UploadNotReady(f"the token keys cannot be read: {exc}") from exc

    targets = KubeUploadTargets(async_kube, config.upload_server_port)
    proxy = UploadProxy(
        targets, Verifier(keys), upstream, config.proxy, refresh_upstream=credentials.changed_now
    )

    async def periodic() -> None:
        # New contexts instead of reloading the live ones: connection threads wrap sockets
        # with them concurrently, and OpenSSL does not promise that is safe while they change.
        before = serving.bundle
        pair = await serving.refresh()
        if before is None or pair != before.serving:
            proxy.use(serving=serving_context(pair, profile=profile.current))
        renewed = await credentials.changed()
        if renewed is not None:
            proxy.use(upstream=renewed)

    def reprofile(fresh: TLSProfile) -> None:
        if serving.bundle is not None:
            proxy.use(serving=serving_context(serving.bundle.serving, profile=fresh))

    try:
        port = await proxy.start(plane.host, plane.port, ctx)
        log.info("serving on %s:%d", plane.host, port)
        try:
            async with following(profile, reprofile):
                await run_until_stopped(
                    lambda: credentials.check_every(
                        ca_life.check_every(serving.bundle, plane.check_interval)
                    ),
                    periodic,
                )
        finally:
            await proxy.stop()
    finally:
        async_kube.close()
