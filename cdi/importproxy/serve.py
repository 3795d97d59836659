"""The ``cdi import-proxy`` process: the relay wired to the cluster.

The upstream proxies are CDIConfig ``config``'s ``importProxy`` (the status the CDIConfig
reconciler keeps, else the spec: what the controller renders importer pods from), read again
when older than ``refresh`` seconds so an operator's change reaches new connections soon; the
ticket key is Secret ``cdi-import-proxy-key`` (``cdi.kube.shared_key``: whichever of the
controller and the relay starts first makes it). An ``https://`` upstream is verified with the
system's CAs and the ConfigMap ``importProxy.trustedCAProxy`` names in the relay's namespace
(CDI's place for it), read with CDIConfig. Read access to CDIConfig, ConfigMaps of its own
namespace and that one Secret is all the relay's ServiceAccount has
(``deploy/60-import-proxy.yaml``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from cdi.api.config import CDIConfig
from cdi.api.constants import CDICONFIG_NAME
from cdi.importproxy.relay import ImportProxyRelay, RelayConfig, Upstream, Upstreams
from cdi.kube.client import CDI_CONFIGS, CONFIG_MAPS, Kube
from cdi.kube.errors import KubeError
from cdi.kube.shared_key import ensure_shared_key
from cdi.lifecycle import run_until_stopped

log = logging.getLogger(__name__)
KEY_SECRET = "cdi-import-proxy-key"


@dataclass(frozen=True)
class ImportProxyServeConfig:
    host: str = "0.0.0.0"
    port: int = 3128
    namespace: str = "cdi"
    key_secret: str = KEY_SECRET
    refresh: float = 5.0
    relay: RelayConfig = field(default_factory=RelayConfig)


def upstream(url: str | None, tls: ssl.SSLContext | None = None) -> Upstream | None:
    """An ``http(s)://[user:pass@]host:port`` proxy URL as the relay dials it; an ``https://``
    one with ``tls`` (``proxy_tls``; else the system's CAs alone). The credentials are only
    ever in the ``Proxy-Authorization`` value, never in a message or a repr."""
    if not url:
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        log.warning("importProxy: only http:// and https:// proxies are supported; ignored")
        return None
    auth = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    if parts.scheme == "http":
        return Upstream(parts.hostname, parts.port or 80, auth)
    return Upstream(parts.hostname, parts.port or 443, auth, tls or ssl.create_default_context())


def proxy_tls(bundle: str) -> ssl.SSLContext:
    """An https:// proxy's trust: the system's CAs plus ``importProxy.trustedCAProxy``'s
    bundle (the ConfigMap's values, PEM); a bundle that does not load is logged and left out
    (the proxy is then trusted only if a system CA signed it)."""
    ctx = ssl.create_default_context()
    if bundle.strip():
        try:
            ctx.load_verify_locations(cadata=bundle)
        except (ssl.SSLError, ValueError) as exc:
            log.warning("importProxy.trustedCAProxy: the bundle does not load (%s)", exc)
    return ctx


class CDIConfigUpstreams:
    """The upstream proxies from CDIConfig, re-read when older than ``refresh`` seconds (1 s
    while there are none); the last good answer is kept while the API server cannot be read."""

    def __init__(self, kube: Kube, refresh: float, namespace: str = "cdi") -> None:
        self.kube, self.refresh, self.namespace = kube, refresh, namespace
        self.value, self.read_at = Upstreams(), float("-inf")
        self._lock = asyncio.Lock()
        self._tls: tuple[str, ssl.SSLContext] | None = None  # (bundle, its context)

    def _read(self) -> Upstreams:
        found = self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        proxy = CDIConfig.from_dict(found or {}).import_proxy
        if proxy is None:
            return Upstreams()
        tls = self._tls_for(proxy.trusted_ca_proxy)
        return Upstreams(upstream(proxy.http_proxy, tls), upstream(proxy.https_proxy, tls))

    def _tls_for(self, config_map: str | None) -> ssl.SSLContext:
        """The context for https:// upstreams, built again only when the bundle changes."""
        bundle = ""
        if config_map:
            found = self.kube.get_or_none(CONFIG_MAPS, config_map, self.namespace) or {}
            values = (str(v) for v in (found.get("data") or {}).values())
            bundle = "\n".join(v for v in values if "-----BEGIN" in v)  # PEM values only
            if not found:
                log.warning("importProxy.trustedCAProxy: no ConfigMap %s", config_map)
        if self._tls is None or self._tls[0] != bundle:
            self._tls = (bundle, proxy_tls(bundle))
        return self._tls[1]

    async def __call__(self) -> Upstreams:
        async with self._lock:
            # no upstream at all: an operator who just set importProxy is seen within 1 s
            refresh = self.refresh if self.value != Upstreams() else min(self.refresh, 1.0)
            if time.monotonic() - self.read_at >= refresh:
                try:
                    self.value = await asyncio.to_thread(self._read)
                    self.read_at = time.monotonic()
                except KubeError as exc:
                    log.warning("CDIConfig cannot be read; the last settings stay: %s", exc)
            return self.value


async def serve_import_proxy(kube: Kube, config: ImportProxyServeConfig) -> None:
    key = await asyncio.to_thread(ensure_shared_key, kube, config.namespace, config.key_secret)
    upstreams = CDIConfigUpstreams(kube, config.refresh, config.namespace)
    relay = ImportProxyRelay(key, upstreams, config.relay)
    port = await relay.start(config.host, config.port)
    log.info("relaying on %s:%d", config.host, port)

    async def nothing() -> None:
        return None

    try:
        await run_until_stopped(3600.0, nothing)
    finally:
        await relay.stop()
