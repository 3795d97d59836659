"""May a DataSource's creator read its source? SubjectAccessReviews for N7 (docs/security.md).

The DataSource reconciler reads the object a DataSource names with the controller's own
cluster-wide rights, and the status it writes (Ready or not, a DataVolume's phase, the source's
``*.kubevirt.io/*`` labels) is read by whoever may read the DataSource. So for a source in
another namespace, each object is read only when the DataSource's creator (the webhook's signed
record, ``cdi.api.datasource_requester``) may ``get`` it, asked with a SubjectAccessReview now:
a claim (``persistentvolumeclaims``), its DataVolume (``datavolumes.cdi.kubevirt.io``), or a
``volumesnapshots.snapshot.storage.k8s.io``. No answer is a no.

Answers are remembered for ``REMEMBER`` seconds per (requester, namespace, resource, name): a
DataSource reconciles on every event of its source, and a revoked right takes effect within
that time (the reconciler also looks again every ``REMEMBER`` seconds).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from cdi.api.cloneauth import AccessCheck, access_review_body
from cdi.api.requester import Requester
from cdi.kube.client import SUBJECT_ACCESS_REVIEWS, AsyncKube, Resource
from cdi.kube.errors import KubeError

REMEMBER = 30.0
_MAX_REMEMBERED = 4096

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Remembered(Generic[K, V]):
    """Authorization answers kept for ``REMEMBER`` seconds each, at most ``_MAX_REMEMBERED``
    of them (all forgotten when full: a burst of distinct keys costs a few extra reviews, never
    memory). Shared by the DataSource reads here and the clone authorizer."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._answers: dict[K, tuple[float, V]] = {}

    async def get(self, key: K, ask: Callable[[], Awaitable[V]]) -> V:
        """The answer remembered for ``key``, else ``ask()``'s, remembered."""
        now = self.clock()
        known = self._answers.get(key)
        if known is not None and known[0] > now:
            return known[1]
        answer = await ask()
        if len(self._answers) >= _MAX_REMEMBERED:
            self._answers.clear()
        self._answers[key] = (now + REMEMBER, answer)
        return answer


async def access_allowed(
    kube: AsyncKube, requester: Requester, namespace: str, check: AccessCheck
) -> bool:
    """One SubjectAccessReview of ``requester`` (with its uid and extra) for ``check`` in
    ``namespace``, as the controller asks it for DataSources and clones; no answer is a no."""
    body = access_review_body(requester, namespace, check)
    try:
        review = await kube.create(SUBJECT_ACCESS_REVIEWS, body)
    except KubeError:
        return False  # no answer is not a yes
    return bool((review.get("status") or {}).get("allowed"))


class SourceReads:
    def __init__(self, kube: AsyncKube, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self._answers: Remembered[tuple[Requester, str, AccessCheck], bool] = Remembered(clock)

    async def may_get(
        self, requester: Requester, resource: Resource, namespace: str, name: str
    ) -> bool:
        """Whether ``requester`` may ``get`` ``resource`` ``namespace/name``."""
        check = AccessCheck("get", resource.group, resource.plural, name=name)
        return await self._answers.get(
            (requester, namespace, check),
            lambda: access_allowed(self.kube, requester, namespace, check),
        )
