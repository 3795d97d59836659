"""The upload proxy's mutual-TLS credentials, kept by the leading controller.

The proxy is the component users reach from outside the cluster, so it holds no CA key (N5,
``docs/security.md``): the controller, which holds both upload CAs anyway, issues the proxy's
client certificate into a Secret the proxy may only read and publishes the upload servers' CA
certificate alone in a ConfigMap (``cdi.pki.upload.ProxyCredentials``). This loop runs
for the leader's term: once at the start (a fresh install has a working proxy as soon as a
controller leads) and every ``interval`` after, so the certificate is renewed with a fifth of
its 30 days left; the proxy reloads it on its own periodic check (hourly). A failed check
(the API server away, a write fenced after a lost Lease) is tried again in ``retry``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

from cdi.kube.client import AsyncKube
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
            await kube.call(credentials.ensure, now)
            delay = interval
        except (KubeError, RuntimeError) as exc:
            log.warning("the upload proxy's credentials could not be checked: %s", exc)
            delay = retry
        await asyncio.sleep(delay)
