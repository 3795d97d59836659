"""The TLS security profile of the control plane's servers, followed from CDIConfig.

CDI's servers watch CDIConfig and choose the profile per connection; ours read the singleton
every ``FOLLOW_INTERVAL`` seconds (one GET of one object) and hand a changed profile to the
server, which applies it to the handshakes that start afterwards:
- the webhook and the token API (asyncio TLS: every SSL object is made on the loop thread) apply
  it to their live context (``cdi.api.tlsprofile.apply``);
- the upload proxy, whose connection threads wrap sockets concurrently, gets a new context
  (``proxy.use``), as it does for a rotated certificate.
A CDIConfig that cannot be read keeps the profile in use (logged); an absent one is CDI's
default, Intermediate. ``on_config`` gets every CDIConfig read, for the process's other
settings from it (its ``logVerbosity``, ``cdi.lifecycle.LogVerbosity``), so one read serves
both. What each profile means, and OpenSSL's limits: ``cdi.api.tlsprofile``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from cdi.api.config import CDIConfig
from cdi.api.constants import CDICONFIG_NAME
from cdi.api.tlsprofile import INTERMEDIATE, TLSProfile
from cdi.kube.client import CDI_CONFIGS, Kube
from cdi.kube.errors import KubeError

log = logging.getLogger(__name__)

FOLLOW_INTERVAL = 5.0


class FollowedProfile:
    def __init__(
        self,
        kube: Kube,
        interval: float = FOLLOW_INTERVAL,
        on_config: Callable[[CDIConfig], None] | None = None,
    ) -> None:
        self.kube = kube
        self.interval = interval
        self.on_config = on_config
        self.current: TLSProfile = INTERMEDIATE

    def read(self) -> TLSProfile:
        """CDIConfig's profile now (blocking); the current one when CDIConfig cannot be read."""
        try:
            found = self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        except KubeError as exc:
            log.warning("CDIConfig cannot be read, the TLS profile stays as it is: %s", exc)
            return self.current
        config = CDIConfig.from_dict(found or {})
        if self.on_config is not None:
            self.on_config(config)
        profile = config.tls_profile
        if profile.note:
            log.warning("CDIConfig tlsSecurityProfile: %s", profile.note)
        return profile

    async def first(self) -> TLSProfile:
        self.current = await asyncio.to_thread(self.read)
        return self.current

    async def follow(self, changed: Callable[[TLSProfile], None]) -> None:
        """Call ``changed`` with every new profile, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            fresh = await asyncio.to_thread(self.read)
            if fresh != self.current:
                log.info(
                    "TLS profile changed: minimum %s, %d ciphers",
                    fresh.min_version,
                    len(fresh.ciphers),
                )
                self.current = fresh
                changed(fresh)


@contextlib.asynccontextmanager
async def following(
    profile: FollowedProfile, changed: Callable[[TLSProfile], None]
) -> AsyncIterator[None]:
    """``profile.follow(changed)`` in the background for the body's duration."""
    task = asyncio.create_task(profile.follow(changed), name="tls-profile")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
