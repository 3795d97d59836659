"""Who may clone from another namespace: CDI's rule, once, for the webhook and the controller.

CDI (``authorize_utils.go``, reference §4.5): a clone within one namespace is always allowed.
Across namespaces the requester needs, in the **source** namespace, either the explicit right
``create datavolumes/source`` (group ``cdi.kubevirt.io``, name = the source) or the implicit
rights a user would need to copy the data by hand: ``create pods`` for a PVC source, ``create
pods`` and ``create persistentvolumeclaims`` for a snapshot source.

The rule is a list of alternatives, each a list of ``AccessCheck`` that must all pass, so the
admission webhook (at creation, for the request's user) and the controller (before it touches
the source, for the user the webhook recorded and signed) ask the same SubjectAccessReviews and
refuse with the same message. Each review carries the whole subject the API server authenticated
(name, groups, uid, extra: ``review_subject``), as the API server's own authorization would.
The answer comes from the cluster's authorizer through a callable, so this module stays pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import GROUP, KIND_DATASOURCE
from cdi.api.requester import Requester
from cdi.api.types import DataVolumeSpec


@dataclass(frozen=True)
class AccessCheck:
    """One SubjectAccessReview's resource attributes (the namespace is the source's)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""


def clone_checks(snapshot: bool, source_name: str) -> tuple[tuple[AccessCheck, ...], ...]:
    """CDI's alternatives for cloning ``source_name`` (a PVC, or a VolumeSnapshot)."""
    explicit = (AccessCheck("create", GROUP, "datavolumes", "source", source_name),)
    pods = AccessCheck("create", "", "pods")
    if snapshot:
        return explicit, (pods, AccessCheck("create", "", "persistentvolumeclaims"))
    return explicit, (pods,)


def authorized(
    ask: Callable[[AccessCheck], bool], alternatives: Sequence[Sequence[AccessCheck]]
) -> bool:
    """True when every check of some alternative is allowed (a failing ``ask`` is a no)."""
    for checks in alternatives:
        if all(_safe(ask, check) for check in checks):
            return True
    return False


def _safe(ask: Callable[[AccessCheck], bool], check: AccessCheck) -> bool:
    try:
        return bool(ask(check))
    except Exception:
        return False  # an authorizer that cannot answer has not said yes


def denial_message(username: str, namespace: str) -> str:
    """CDI's words (``authorize_utils.go``)."""
    return f"User {username} has insufficient permissions in clone source namespace {namespace}"


def review_subject(user: Requester) -> dict[str, Any]:
    """A SubjectAccessReview's subject as the API server gives it to its authorizers: name,
    groups, and ``uid`` and ``extra`` when the request had them (scoped tokens and
    impersonation with extras are judged with their scopes, not as the bare user)."""
    subject: dict[str, Any] = {"user": user.username, "groups": list(user.groups)}
    if user.uid:
        subject["uid"] = user.uid
    if user.extra:
        subject["extra"] = user.extra_dict()
    return subject


def access_review_body(user: Requester, namespace: str, check: AccessCheck) -> dict[str, Any]:
    """The SubjectAccessReview asking whether ``user`` may do ``check`` in ``namespace``."""
    attributes = {
        "namespace": namespace,
        "verb": check.verb,
        "group": check.group,
        "resource": check.resource,
    }
    if check.subresource:
        attributes["subresource"] = check.subresource
    if check.name:
        attributes["name"] = check.name
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {**review_subject(user), "resourceAttributes": attributes},
    }


@dataclass(frozen=True)
class CloneSource:
    """The object a clone reads: a PVC or (``snapshot``) a VolumeSnapshot."""

    namespace: str
    name: str
    snapshot: bool = False

    @property
    def label(self) -> str:
        return "snapshot" if self.snapshot else "pvc"


DataSourceGetter = Callable[[str, str], Mapping[str, Any] | None]


def clone_source(
    spec: DataVolumeSpec, namespace: str, get_data_source: DataSourceGetter
) -> CloneSource | None:
    """What ``spec`` clones from (None: not a clone, or a DataSource that names nothing yet).
    ``sourceRef`` goes through the DataSource, and one DataSource it references."""
    src = spec.source
    if src is not None and src.pvc is not None:
        return CloneSource(src.pvc.namespace or namespace, src.pvc.name)
    if src is not None and src.snapshot is not None:
        return CloneSource(src.snapshot.namespace or namespace, src.snapshot.name, snapshot=True)
    ref = spec.source_ref
    if ref is None or ref.kind != KIND_DATASOURCE:
        return None
    ds_ns = ref.namespace or namespace
    source = _data_source_source(get_data_source(ds_ns, ref.name))
    inner = source.get("dataSource") if source else None
    if isinstance(inner, Mapping):
        source = _data_source_source(get_data_source(ds_ns, str(inner.get("name") or "")))
    for key, snapshot in (("pvc", False), ("snapshot", True)):
        obj = (source or {}).get(key)
        if isinstance(obj, Mapping) and obj.get("name"):
            return CloneSource(str(obj.get("namespace") or ds_ns), str(obj["name"]), snapshot)
    return None


def _data_source_source(ds: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    source = ((ds or {}).get("spec") or {}).get("source")
    return source if isinstance(source, Mapping) else None
