"""Leader election with a ``coordination.k8s.io/v1`` Lease (client-go's ``leaderelection``).

Only the holder of the Lease runs reconcilers, so two controller replicas never act on the same
DataVolume. The rules are client-go's:

- a candidate takes the Lease if it does not exist, or if it has not been renewed for
  ``lease_duration`` *as observed locally* (we time how long the record has stayed unchanged on
  our own monotonic clock, so clock skew between nodes does not matter);
- every write is a compare-and-swap on ``resourceVersion``; a ``Conflict`` means someone else
  won this round;
- the holder renews every ``retry_period``; if it cannot renew within ``renew_deadline`` it has
  lost the lease and must stop acting (``LeadershipLost``);
- on graceful shutdown the holder releases the Lease (empty holder, 1 s duration) so a
  successor need not wait for expiry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cdi.kube.client import LEASES, AsyncKube
from cdi.kube.errors import Conflict, KubeError, NotFound

log = logging.getLogger(__name__)


class LeadershipLost(RuntimeError):
    pass


@dataclass(frozen=True)
class LeaderConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def micro_time(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, kube: AsyncKube, config: LeaderConfig) -> None:
        self.kube = kube
        self.config = config
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0

    @property
    def identity(self) -> str:
        return self.config.identity

    async def acquire(self) -> None:
        """Return once we hold the Lease."""
        while True:
            if await self.try_acquire_or_renew():
                break
            await asyncio.sleep(self.config.retry_period)
        log.info(
            "acquired lease %s/%s as %s", self.config.namespace, self.config.name, self.identity
        )

    async def hold(self) -> None:
        """Renew until the Lease is lost; then raise ``LeadershipLost``."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.config.retry_period)
            try:
                ok = await self.try_acquire_or_renew()
            except KubeError as exc:
                log.warning("renewing lease: %s", exc)
                ok = False
            if ok:
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > self.config.renew_deadline:
                raise LeadershipLost(f"could not renew lease {self.config.name}")

    async def try_acquire_or_renew(self) -> bool:
        cfg = self.config
        now = micro_time()
        try:
            lease = await self.kube.get(LEASES, cfg.name, cfg.namespace)
        except NotFound:
            return await self._create(now)
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        expired = time.monotonic() - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(
            holderIdentity=self.identity,
            renewTime=now,
            leaseDurationSeconds=int(cfg.lease_duration),
        )
        lease["spec"] = spec
        try:
            await self.kube.replace(LEASES, lease)
        except Conflict:
            return False
        self._observed, self._observed_at = (self.identity, now), time.monotonic()
        return True

    async def _create(self, now: str) -> bool:
        cfg = self.config
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(cfg.lease_duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            await self.kube.create(LEASES, lease)
        except Conflict:
            return False
        self._observed, self._observed_at = (self.identity, now), time.monotonic()
        return True

    async def release(self) -> None:
        """Give the Lease up if we hold it (best effort: shutdown must not hang on it)."""
        cfg = self.config
        try:
            lease = await self.kube.get(LEASES, cfg.name, cfg.namespace)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time())
            lease["spec"] = spec
            await self.kube.replace(LEASES, lease)
        except KubeError as exc:
            log.warning("releasing lease: %s", exc)
