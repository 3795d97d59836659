"""The upload proxy's mutual-TLS credentials, kept by the leading controller.

The proxy is the component users reach from outside the cluster, so it holds no CA key (N5,
``docs/security.md``): the controller, which holds both upload CAs anyway, issues the proxy's
client certificate into a Secret the proxy may only read and publishes the upload servers' CA
certificate alone in a ConfigMap (``cdi.pki.upload.ProxyCredentials``). This loop runs
for the leader's term: once at the start (a fresh install has a working proxy as soon as a
controller leads) and every ``interval`` after, so the certificate is renewed with a fifth of
its 30 days left (the CDI resource's ``certConfig.client``, when set: its duration and
renewBefore, checked every quarter of renewBefore); the proxy reloads it on its own periodic
check (hourly). A failed check
(the API server away, a write fenced after a lost Lease) is tried again in ``retry``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

from cdi.api.cdiresource import Lifetime, lifetimes
from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig
from cdi.api.constants import CDICONFIG_NAME
from cdi.kube.client import CDI_CONFIGS, AsyncKube
from cdi.kube.errors import KubeError
from cdi.pki.upload import ProxyCredentials, UploadCAs

log = logging.getLogger(__name__)


async def keep_proxy_credentials(
    kube: AsyncKube,
    namespace: str,
    interval: float = 600.0,
    retry: float = 10.0,
    clock: Callable[[], float] = time.time,
) -> None:
    """Issue and renew the upload proxy's credentials until cancelled."""
    credentials = ProxyCredentials(UploadCAs(kube.sync, namespace))
    while True:
        now = dt.datetime.fromtimestamp(clock(), dt.UTC)
        try:
            client = await _client_lifetime(kube)
            await kube.call(credentials.ensure, now, client)
            delay = interval
            if client is not None:  # checked often enough to renew in time
                delay = min(interval, max(retry, client.renew_before.total_seconds() / 4))
        except (KubeError, RuntimeError) as exc:
            log.warning("the upload proxy's credentials could not be checked: %s", exc)
            delay = retry
        await asyncio.sleep(delay)


async def _client_lifetime(kube: AsyncKube) -> Lifetime | None:
    """The CDI resource's ``certConfig.client`` as CDIConfig's status carries it; None when
    it sets none (or the config is unreadable)."""
    raw = await kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
    try:
        config = CDIConfig.from_dict(raw) if raw else CDIConfig()
    except SchemaError:
        return None
    if config.cert_config.client is None:
        return None
    return lifetimes(config.cert_config).client
