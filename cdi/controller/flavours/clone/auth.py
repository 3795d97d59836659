"""The controller's own clone authorization, asked again before it touches a source.

The webhook refuses an unauthorized cross-namespace clone at admission, but the controller cannot
know that admission happened: the webhook may have been out of the path (failurePolicy, an
outage, a restore from backup), and a DataVolume's annotations are its creator's to write. So
before it reads or clones a source in another namespace, the controller

1. takes the requester only from a record the webhook signed (``cdi.api.requester``
   ``trusted_requester``: HMAC over namespace, name, user, groups, uid, extra and time); no
   signed record, or no key configured, means no cross-namespace clone;
2. asks the API server the same SubjectAccessReviews as the webhook (``cdi.api.cloneauth``) for
   that user (name, groups, uid and extra, as recorded and signed), in the source namespace,
   now (rights may have been revoked since).

On the controller's own DataVolumes (a DataImportCron's imports: the webhook-signed requester is
the controller's ServiceAccount, learned once by a SelfSubjectReview) the requester is instead
the signed on-behalf record (``cdi.api.onbehalf``: the cron namespace's ``default``
ServiceAccount); without one the controller's own rights never authorize a cross-namespace
clone. The on-behalf record is read on no one else's DataVolume.

Same-namespace clones need neither. The answer is a message (CDI's for a denial) or None.
A cross-namespace answer is remembered (``source_reads.Remembered``) for ``REMEMBER`` seconds
per DataVolume (by UID and requester record) and source: a clone reconciles every second or
two, and a revoked right takes effect within that time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from cdi.api.cloneauth import (
    AccessCheck,
    CloneSource,
    authorized,
    clone_checks,
    denial_message,
)
from cdi.api.onbehalf import trusted_on_behalf
from cdi.api.requester import Requester, trusted_requester
from cdi.controller.source_reads import Remembered, access_allowed
from cdi.kube.client import AsyncKube, Resource
from cdi.kube.errors import KubeError

SELF_SUBJECT_REVIEWS = Resource(
    "authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False
)

UNRECORDED = (
    "the requester of this DataVolume was not recorded by the admission webhook, so it may "
    "not clone from namespace {ns}"
)
NO_DELEGATION = (
    "this DataVolume was created by the controller without a valid on-behalf record, so it "
    "may not clone from namespace {ns}"
)
UNKNOWN_SELF = "the controller could not learn its own identity; clone from namespace {ns} waits"
REASON_UNAUTHORIZED = "CloneNotAuthorized"


async def own_username(kube: AsyncKube) -> str | None:
    """Who the controller authenticates as (a SelfSubjectReview), None when it cannot tell."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        review = await kube.create(SELF_SUBJECT_REVIEWS, body)
    except KubeError:
        return None
    user = ((review.get("status") or {}).get("userInfo") or {}).get("username")
    return str(user) if user else None


class CloneAuthorizer:
    def __init__(
        self, kube: AsyncKube, key: bytes | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube = kube
        self.key = key
        self._answers: Remembered[tuple[str, Requester, CloneSource], str | None] = Remembered(
            clock
        )
        self._self: str | None = None

    async def _own_username(self) -> str | None:
        if self._self is None:
            self._self = await own_username(self.kube)
        return self._self

    async def denial(self, obj: Mapping[str, Any], source: CloneSource) -> str | None:
        """None when the DataVolume ``obj`` (as read) may clone ``source``; else why not."""
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        if source.namespace == namespace:
            return None
        requester = trusted_requester(obj, self.key)
        if requester is None:
            return UNRECORDED.format(ns=source.namespace)
        delegated = await self._delegated(obj, requester, source)
        if isinstance(delegated, str):
            return delegated
        requester = delegated
        key = (str((obj.get("metadata") or {}).get("uid") or ""), requester, source)
        return await self._answers.get(key, lambda: self._ask(requester, source))

    async def _delegated(
        self, obj: Mapping[str, Any], requester: Requester, source: CloneSource
    ) -> Requester | str:
        """The identity to authorize (or why none): the requester, except on the controller's
        own DataVolume, where only a valid on-behalf record names one. The guard: the record is
        honoured only when the webhook-signed requester is the controller itself."""
        me = await self._own_username()
        if me is None:  # fail closed: it might be the controller's own DataVolume
            return UNKNOWN_SELF.format(ns=source.namespace)
        if requester.username != me:
            return requester  # a tenant's on-behalf annotations are never read
        on_behalf = trusted_on_behalf(obj, self.key, (source.namespace, source.name))
        if on_behalf is None or source.snapshot:
            return NO_DELEGATION.format(ns=source.namespace)
        return on_behalf

    async def _ask(self, requester: Requester, source: CloneSource) -> str | None:
        alternatives = clone_checks(source.snapshot, source.name)
        answers = {
            check: await self._allowed(requester, source.namespace, check)
            for checks in alternatives
            for check in checks
        }
        if authorized(answers.__getitem__, alternatives):
            return None
        return denial_message(requester.username, source.namespace)

    async def _allowed(self, requester: Requester, namespace: str, check: AccessCheck) -> bool:
        return await access_allowed(self.kube, requester, namespace, check)
