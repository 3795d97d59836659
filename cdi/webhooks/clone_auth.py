"""Admission-time clone authorization: refuse a cross-namespace clone the requester may not do.

CDI's mutating webhook (``datavolume-mutate.go``) asks, for a DataVolume created with a clone
source in another namespace, the SubjectAccessReviews of ``cdi.api.cloneauth`` for the request's
user and groups, and rejects the request with "User <u> has insufficient permissions in clone
source namespace <ns>" (field ``spec.source.PVC.namespace``). We answer it from the validating
webhook instead: the verdict is the same 422 rejection, the mutating webhook stays free of
network calls. As in CDI (whose mutating webhook runs before its validating one), the
refusal comes before the spec rules, and names nothing but the namespace the requester gave.

Only creation is checked (the spec is immutable afterwards); a clone within the DataVolume's
own namespace is always allowed. The controller checks again before it touches the source,
with the requester the mutating webhook recorded and signed (``cdi.api.requester``), so a
DataVolume admitted while this webhook was not in the path still clones nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from cdi.api.cloneauth import (
    AccessCheck,
    CloneSource,
    authorized,
    clone_checks,
    clone_source,
    denial_message,
)
from cdi.api.codec import SchemaError
from cdi.api.types import DataVolumeSpec
from cdi.webhooks.mutation import UserInfo
from cdi.webhooks.validation import ClusterLookup
from cdi.webhooks.verdict import Cause, ValidationResult

FIELD = "spec.source.PVC.namespace"


class AccessReviewer(Protocol):
    """Whether ``user`` may do ``check`` in ``namespace`` (a SubjectAccessReview)."""

    def allows(self, user: UserInfo, namespace: str, check: AccessCheck) -> bool: ...


class NoCrossNamespaceClones:
    """The reviewer when none is wired: nobody may clone across namespaces."""

    def allows(self, user: UserInfo, namespace: str, check: AccessCheck) -> bool:
        return False


def authorize_clone(
    obj: Mapping[str, Any],
    namespace: str,
    user: UserInfo,
    lookup: ClusterLookup,
    reviewer: AccessReviewer,
) -> ValidationResult:
    """Allowed, or CDI's rejection, for a DataVolume being created in ``namespace``."""
    try:
        spec = DataVolumeSpec.from_dict(obj.get("spec") or {}, "spec")
    except SchemaError:
        return ValidationResult()  # the spec rules reported it already
    source = clone_source(spec, namespace, lookup.get_data_source)
    ref = spec.source_ref
    if source is None and ref is not None and ref.namespace and ref.namespace != namespace:
        # A DataSource the requester may not read: authorize against its namespace, so the
        # answer is CDI's refusal whether it exists or not.
        source = CloneSource(ref.namespace, "")
    if source is None or source.namespace == namespace:
        return ValidationResult()
    alternatives = clone_checks(source.snapshot, source.name)
    if authorized(lambda check: reviewer.allows(user, source.namespace, check), alternatives):
        return ValidationResult()
    return ValidationResult((Cause(denial_message(user.username, source.namespace), FIELD),))
