"""Who may read the controller's ``/metrics``: CDI's #4121 (controller-runtime's
``WithAuthenticationAndAuthorization``, the kube-rbac-proxy contract), decided here once.

A scrape must carry ``Authorization: Bearer <token>``. The token is sent to the API server in a
``TokenReview``; the user it names is asked about in a ``SubjectAccessReview`` for ``get`` on
the nonResourceURL ``/metrics``. No or a bad token: 401; a good token without that right: 403;
the API server unreachable: 503 (and nothing remembered). The right comes from a ClusterRole
such as ``cdi-metrics-reader`` (``deploy/17-rbac-metrics.yaml``), bound to whoever scrapes.

Answers are remembered per token (its SHA-256, never the token) so a Prometheus scraping both
replicas every 30 s costs the API server two reviews a minute per replica, not four a scrape:
an allowed token for ``allow_ttl`` (60 s: a revoked right or deleted ServiceAccount stops
working within a minute), a refused one for ``deny_ttl`` (10 s: a new binding works soon).
The cache holds at most ``max_entries`` tokens (oldest dropped first), so random tokens cost
one TokenReview each and never memory without bound; at most ``max_reviews`` reviews run at
once, on the guard's own threads, so a flood of them waits instead of taking the reconcilers'
API threads.

The reviews are not fenced by the leader Lease (``Kube.fenced``): a standby answers scrapes
too, so the caller hands in an unfenced client.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.kube.client import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS, AsyncKube
from cdi.kube.errors import KubeError

METRICS_PATH = "/metrics"
ALLOW_TTL = 60.0
DENY_TTL = 10.0
MAX_ENTRIES = 1024
MAX_REVIEWS = 4


@dataclass(frozen=True)
class Verdict:
    """The HTTP status a scrape gets (200, 401, 403 or 503) and why, for the response body."""

    status: int
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


UNAUTHENTICATED = Verdict(401, "Unauthorized: a bearer token is required")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def token_review(token: str) -> dict[str, Any]:
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }


def metrics_access_review(user: Mapping[str, Any]) -> dict[str, Any]:
    """May the user a TokenReview returned ``get`` the nonResourceURL ``/metrics``?"""
    spec: dict[str, Any] = {
        "user": str(user.get("username") or ""),
        "groups": list(user.get("groups") or []),
        "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
    }
    if user.get("uid"):
        spec["uid"] = str(user["uid"])
    if user.get("extra"):
        spec["extra"] = {k: list(v) for k, v in dict(user["extra"]).items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


class MetricsGuard:
    """``await guard.check(request.headers.get("Authorization"))`` -> a ``Verdict``."""

    def __init__(
        self,
        kube: AsyncKube,
        *,
        allow_ttl: float = ALLOW_TTL,
        deny_ttl: float = DENY_TTL,
        max_entries: int = MAX_ENTRIES,
        max_reviews: int = MAX_REVIEWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.allow_ttl, self.deny_ttl = allow_ttl, deny_ttl
        self.max_entries = max_entries
        self.clock = clock
        self._reviews = asyncio.Semaphore(max_reviews)
        self._cache: OrderedDict[bytes, tuple[float, Verdict]] = OrderedDict()
        self.reviews_sent = 0  # TokenReviews asked, for tests and logs

    async def check(self, authorization: str | None) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return UNAUTHENTICATED
        key = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            async with self._reviews:
                verdict = await self._review(token)
        except KubeError as exc:
            return Verdict(503, f"the token could not be reviewed: {exc.message}")
        self._remember(key, verdict)
        return verdict

    async def _review(self, token: str) -> Verdict:
        self.reviews_sent += 1
        answer = await self.kube.create(TOKEN_REVIEWS, token_review(token))
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            return Verdict(401, "Unauthorized: the token was not accepted")
        user = status.get("user") or {}
        access = await self.kube.create(SUBJECT_ACCESS_REVIEWS, metrics_access_review(user))
        if (access.get("status") or {}).get("allowed"):
            return Verdict(200, "")
        name = user.get("username") or "?"
        return Verdict(403, f'Forbidden: {name} may not get nonResourceURL "{METRICS_PATH}"')

    def _remember(self, key: bytes, verdict: Verdict) -> None:
        ttl = self.allow_ttl if verdict.allowed else self.deny_ttl
        self._cache[key] = (self.clock() + ttl, verdict)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
