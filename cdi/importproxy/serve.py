"""The ``cdi import-proxy`` process: the relay wired to the cluster.

The upstream proxies are CDIConfig ``config``'s ``importProxy`` (the status the CDIConfig
reconciler keeps, else the spec: what the controller renders importer pods from), read again
when older than ``refresh`` seconds so an operator's change reaches new connections soon; the
ticket key is Secret ``cdi-import-proxy-key`` (``cdi.kube.shared_key``: whichever of the
controller and the relay starts first makes it). An ``https://`` proxy's certificate is
verified with the system's CAs plus the ConfigMap CDIConfig ``importProxy.trustedCAProxy``
names in the relay's namespace. Read access to CDIConfig, that one Secret and the ConfigMaps of
``cdi`` is all the relay's ServiceAccount has (``deploy/60-import-proxy.yaml``).
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


def upstream(url: str | None, trusted_ca: str | None = None) -> Upstream | None:
    """An ``http://`` or ``https://`` ``[user:pass@]host:port`` proxy URL as the relay dials
    it. An https proxy's certificate is verified against the system's CAs plus ``trusted_ca``
    (PEM: CDIConfig ``importProxy.trustedCAProxy``'s bundle); the credentials are only ever in
    the ``Proxy-Authorization`` value, never in a message."""
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
    tls = None
    if parts.scheme == "https":
        tls = ssl.create_default_context()
        if trusted_ca:
            try:
                tls.load_verify_locations(cadata=trusted_ca)
            except (ssl.SSLError, ValueError):
                log.warning("importProxy.trustedCAProxy holds no usable certificate; ignored")
    default_port = 443 if parts.scheme == "https" else 80
    return Upstream(parts.hostname, parts.port or default_port, auth, tls)


class CDIConfigUpstreams:
    """The upstream proxies from CDIConfig, re-read when older than ``refresh`` seconds (1 s
    while there are none); the last good answer is kept while the API server cannot be read."""

    def __init__(self, kube: Kube, refresh: float, namespace: str = "cdi") -> None:
        self.kube, self.refresh, self.namespace = kube, refresh, namespace
        self.value, self.read_at = Upstreams(), float("-inf")
        self._lock = asyncio.Lock()

    def _read(self) -> Upstreams:
        found = self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        proxy = CDIConfig.from_dict(found or {}).import_proxy
        if proxy is None:
            return Upstreams()
        ca = self._trusted_ca(proxy.trusted_ca_proxy)
        return Upstreams(upstream(proxy.http_proxy, ca), upstream(proxy.https_proxy, ca))

    def _trusted_ca(self, name: str | None) -> str | None:
        """The PEM bundle of ConfigMap ``name`` in the relay's namespace (CDI's
        ``trustedCAProxy``: every value, as the importer reads the copy it mounts)."""
        if not name:
            return None
        found = self.kube.get_or_none(CONFIG_MAPS, name, self.namespace)
        data = (found or {}).get("data") or {}
        bundle = "\n".join(str(v) for v in data.values() if "-----BEGIN" in str(v))
        return bundle or None

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
