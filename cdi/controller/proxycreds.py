"""The upload CAs' rotation and the upload proxy's mutual-TLS credentials, kept by the leading
controller.

The proxy is the component users reach from outside the cluster, so it holds no CA key (N5,
``docs/security.md``): the controller, which holds both upload CAs anyway, issues the proxy's
client certificate into a Secret the proxy may only read and publishes the upload servers' CA
certificates in a ConfigMap (``cdi.pki.upload.ProxyCredentials``). The same check takes one
step of each upload CA's staged rotation (``cdi.pki.uploadca``: stage, switch, drop, under the
CDI resource's ``certConfig.ca``); the client CA's switch waits until every live upload pod
trusts the staged CA, so this loop reads which client CAs each live upload server
pod's annotation names when (and only when) that switch is otherwise due.

The loop runs for the leader's term: once at the start (a fresh install has a working proxy as
soon as a controller leads), then as ``ProxyCredentials.ensure`` says (at most ``interval``; a
quarter of the CA's stage; no later than the next step may fall due). The proxy re-reads both
objects at least a quarter of a stage apart, and a quarter of what is left of them
(``cdi.upload.serve``). A failed check (the API server away, a write fenced after a lost Lease)
is tried again in ``retry``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterator

from cdi.api.cdiresource import lifetimes
from cdi.api.config import CDIConfig
from cdi.api.constants import LABEL_APP, LABEL_APP_VALUE, LABEL_COMPONENT
from cdi.kube.client import PODS, AsyncKube, Kube
from cdi.kube.errors import KubeError
from cdi.pki.upload import (
    SERVER_CERT_LIFETIME,
    ProxyCredentials,
    UploadCAs,
    UploadLifetimes,
    server_lifetime,
)
from cdi.render.upload_pod import ANN_CLIENT_CAS, UPLOAD_COMPONENT

log = logging.getLogger(__name__)

UPLOAD_PODS = f"{LABEL_APP}={LABEL_APP_VALUE},{LABEL_COMPONENT}={UPLOAD_COMPONENT}"


async def keep_proxy_credentials(
    kube: AsyncKube,
    namespace: str,
    config: Callable[[], CDIConfig],
    interval: float = 600.0,
    retry: float = 10.0,
    clock: Callable[[], float] = time.time,
    server_default: dt.timedelta = SERVER_CERT_LIFETIME,
    tick: float = 5.0,
) -> None:
    """Rotate the upload CAs and keep the upload proxy's credentials until cancelled.
    ``config``: CDIConfig as the controller's cache holds it. Between checks its
    ``certConfig`` is looked at every ``tick`` seconds: a changed one is checked at once (a
    shorter ``ca`` may make a rotation due now)."""
    credentials = ProxyCredentials(UploadCAs(kube.sync, namespace))
    period = dt.timedelta(seconds=interval)
    while True:
        now = dt.datetime.fromtimestamp(clock(), dt.UTC)
        lives = _lifetimes(config(), server_default)
        try:
            live = _live_trust(kube.sync)
            wait = await kube.call(credentials.ensure, now, lives, live, period)
            delay = wait.total_seconds()
        except (KubeError, RuntimeError) as exc:
            log.warning("the upload CAs and the proxy's credentials could not be checked: %s", exc)
            delay = retry
        changed = functools.partial(_changed, config, server_default, lives)
        await _wait(changed, delay, tick, clock)


def _changed(
    config: Callable[[], CDIConfig], server_default: dt.timedelta, used: UploadLifetimes
) -> bool:
    return _lifetimes(config(), server_default) != used


async def _wait(
    changed: Callable[[], bool], delay: float, tick: float, clock: Callable[[], float]
) -> None:
    """Sleep ``delay`` seconds, or until ``changed`` says so (asked every ``tick``)."""
    until = clock() + delay
    while (left := until - clock()) > 0:
        await asyncio.sleep(min(tick, left))
        if changed():
            return


def _lifetimes(config: CDIConfig, server_default: dt.timedelta) -> UploadLifetimes:
    """The CDI resource's ``certConfig`` as CDIConfig's status carries it."""
    lives = lifetimes(config.cert_config)
    client = lives.client if config.cert_config.client is not None else None
    return UploadLifetimes(lives.ca, server_lifetime(config, server_default), client)


def _live_trust(kube: Kube) -> Callable[[], Iterator[frozenset[str]]]:
    """The client CAs each live upload server pod was given, as the fingerprints its
    annotation (``ANN_CLIENT_CAS``, written by the controller with the pod) names. The pods are
    the tenants' to edit: a tenant can only delay the switch (to the forced one,
    ``cdi.pki.uploadca``) or make its own pod refuse the proxy; tenants' Secrets are not read."""

    def read() -> Iterator[frozenset[str]]:
        pods = kube.list(PODS, label_selector=UPLOAD_PODS).get("items") or []
        for pod in pods:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            yield frozenset(str(annotations.get(ANN_CLIENT_CAS) or "").split(","))

    return read
