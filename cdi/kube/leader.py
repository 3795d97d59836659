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

Losing the Lease is decided on our own clock, even when the API server does not answer: a
renewal that hangs (etcd down: the API server holds requests until its own timeout) is given up
at the renew deadline, counted from when the last successful renewal was *sent*. The fence
(``fence``, applied by ``cdi.kube.client.Kube.fenced`` to every write of the reconcilers) makes
that decision binding for writes too: a write may start only before the renew deadline, and
carries as its timeout what is left of ``lease_duration``. A standby takes the Lease only after
it has seen the record unchanged for ``lease_duration`` on its own clock, starting no earlier
than our last renewal was sent, so no write of ours can still be in flight, as a client request,
when a successor starts acting. (The API server itself may hold a request a client gave up on
for a moment longer; the controller's reconcilers check the claim afresh before the decisions
that a stale view could get wrong.) The Lease's own requests use a client that is not fenced
and, in the manager, a thread pool of their own, so renewals never queue behind a burst of
reconciles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cdi.kube.client import LEASES, AsyncKube
from cdi.kube.errors import Conflict, KubeError

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
    def __init__(
        self,
        kube: AsyncKube,
        config: LeaderConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.config = config
        self.clock = clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        # our clock when the last successful acquire or renewal was sent; None: not leading
        self._renewed_at: float | None = None

    @property
    def identity(self) -> str:
        return self.config.identity

    async def acquire(self) -> None:
        """Return once we hold the Lease, with time left to act on it (an acquisition whose
        request the API server held past the renew deadline is renewed first)."""
        while True:
            if await self.try_acquire_or_renew() and self.fence() > 0:
                break
            await asyncio.sleep(self.config.retry_period)
        log.info(
            "acquired lease %s/%s as %s", self.config.namespace, self.config.name, self.identity
        )

    def fence(self) -> float:
        """Seconds a write sent now may take: until the Lease could pass to a successor.
        0 once the renew deadline has passed without a renewal (or before leading)."""
        if self._renewed_at is None:
            return 0.0
        elapsed = self.clock() - self._renewed_at
        if elapsed >= self.config.renew_deadline:
            return 0.0
        return self.config.lease_duration - elapsed

    async def hold(self) -> None:
        """Renew until the Lease is lost; then raise ``LeadershipLost``. Lost means: no
        renewal succeeded within ``renew_deadline`` of the last one (a renewal the API server
        does not answer is given up then), or another holder has it."""
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.retry_period)
            left = (self._renewed_at or 0.0) + cfg.renew_deadline - self.clock()
            if left <= 0:
                raise self._lost(f"could not renew lease {cfg.name} in {cfg.renew_deadline}s")
            try:
                async with asyncio.timeout(left):
                    ok = await self.try_acquire_or_renew()
            except TimeoutError:
                raise self._lost(
                    f"could not renew lease {cfg.name} in {cfg.renew_deadline}s: "
                    "the API server did not answer"
                ) from None
            except KubeError as exc:
                log.warning("renewing lease: %s", exc)
                ok = False
            holder = self._observed[0] if self._observed else ""
            if not ok and holder and holder != self.identity:
                raise self._lost(f"lease {cfg.name} is held by {holder}")

    def _lost(self, message: str) -> LeadershipLost:
        self._renewed_at = None  # the fence closes at once
        return LeadershipLost(message)

    async def try_acquire_or_renew(self) -> bool:
        cfg = self.config
        sent = self.clock()
        now = micro_time()
        lease = await self.kube.get_or_none(LEASES, cfg.name, cfg.namespace)
        if lease is None:
            return await self._create(now, sent)
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        expired = self.clock() - self._observed_at > duration
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
        self._observed, self._observed_at = (self.identity, now), self.clock()
        self._renewed_at = sent
        return True

    async def _create(self, now: str, sent: float) -> bool:
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
        if await self.kube.create_if_absent(LEASES, lease) is None:
            return False
        self._observed, self._observed_at = (self.identity, now), self.clock()
        self._renewed_at = sent
        return True

    async def release(self) -> None:
        """Give the Lease up if we hold it (best effort: shutdown must not hang on it)."""
        cfg = self.config
        self._renewed_at = None  # no write of ours from here on
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
