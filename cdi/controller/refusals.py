"""A claim or worker pod the API server would not create: what the DataVolume says, and when to
try again.

CDI's rule (``newPersistentVolumeClaim``, ``HandleFailedPod``): a create refused because the
namespace's ResourceQuota would be exceeded is not a failure of the DataVolume. It stays
Pending (or in its scheduled phase) with reason ``ErrExceededQuota`` and a Warning event, and
goes on by itself once the quota is raised or usage drops. So the refused create is simply
tried again every ``QUOTA_RETRY`` seconds: nothing watches ResourceQuotas, and a retry that is
refused again costs one request.

- A refused **claim** is the Bound condition's problem (``ClaimProblem``): False,
  ``ErrExceededQuota``, the API server's message (``exceeded quota: <quota>, requested: ...``).
- A refused **worker pod** is the Running condition's: False, ``ErrExceededQuota`` (any other
  403, such as the worker pod admission policy, ``ErrStartingPod``), message
  ``Error starting pod '<pod>': <the API server's message>``.

The gateway (``cdi.kube.errors``) already told a quota's 403 (``QuotaExceeded``) from the rest;
nothing here reads a message.
"""

from __future__ import annotations

from cdi.api.constants import ConditionReason
from cdi.controller.status import ClaimProblem
from cdi.kube.errors import Forbidden, QuotaExceeded

QUOTA_RETRY = 5.0  # seconds between creates a quota refused
POD_REFUSALS = frozenset({ConditionReason.ERR_EXCEEDED_QUOTA, ConditionReason.ERR_STARTING_POD})


def refused_claim(exc: QuotaExceeded) -> ClaimProblem:
    return ClaimProblem(ConditionReason.ERR_EXCEEDED_QUOTA, exc.message)


def refused_pod(name: str, exc: Forbidden) -> tuple[str, str]:
    """The Running condition's (reason, message) for a worker pod whose create got ``exc``."""
    quota = isinstance(exc, QuotaExceeded)
    reason = ConditionReason.ERR_EXCEEDED_QUOTA if quota else ConditionReason.ERR_STARTING_POD
    return str(reason), f"Error starting pod '{name}': {exc.message}"
