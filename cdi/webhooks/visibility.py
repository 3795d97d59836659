"""The cluster as the requester may see it: admission answers leak nothing across namespaces.

A DataVolume may name objects in other namespaces (a clone source PVC, a ``sourceRef``
DataSource, the PVC a DataSource points at). The validation rules look those objects up with
the webhook's own rights, and CDI's messages differ with what they find ("not found",
"contentType do not match", "target resources requests storage size is smaller than the
source"), so without care a tenant could probe any namespace for which PVCs exist, their
content type and their size.

``RequesterLookup`` wraps the webhook's ``ClusterLookup``: an object is looked up only when a
SubjectAccessReview says the requester may ``get`` it; otherwise it is "absent", before the
webhook even reads it, so the answer is the same whether it exists or not. That holds for the
DataVolume's own namespace too: the right to create DataVolumes somewhere is not the right to
read its claims (a role may grant one without the other), so "own namespace" earns no
shortcut. The namespace is the admission request's, set by the API server, never the object's
``metadata.namespace``. An authorizer that fails (API error) counts as "may not read": the safe
answer is the one that reveals nothing. Answers are kept for the one review (a lookup repeated
by two rules asks once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdi.api.cloneauth import review_subject
from cdi.api.constants import GROUP
from cdi.webhooks.mutation import UserInfo
from cdi.webhooks.validation import ClusterLookup


class Authorizer(Protocol):
    """Whether ``user`` may ``get`` the named object (a SubjectAccessReview in the cluster)."""

    def can_read(
        self, user: UserInfo, namespace: str, group: str, resource: str, name: str
    ) -> bool: ...


class NoCrossNamespaceReads:
    """The authorizer when none is wired: nobody may see any object through the webhook."""

    def can_read(
        self, user: UserInfo, namespace: str, group: str, resource: str, name: str
    ) -> bool:
        return False


@dataclass(frozen=True)
class RequesterLookup:
    """A ``ClusterLookup`` that shows objects only to those who may read them."""

    inner: ClusterLookup
    authorizer: Authorizer
    user: UserInfo
    answers: dict[tuple[str, str, str, str], bool] = field(default_factory=dict, compare=False)

    def _visible(self, namespace: str, group: str, resource: str, name: str) -> bool:
        key = (namespace, group, resource, name)
        if key not in self.answers:
            self.answers[key] = self._ask(*key)
        return self.answers[key]

    def _ask(self, namespace: str, group: str, resource: str, name: str) -> bool:
        try:
            return self.authorizer.can_read(self.user, namespace, group, resource, name)
        except Exception:
            return False

    def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if not self._visible(namespace, "", "persistentvolumeclaims", name):
            return None
        return self.inner.get_pvc(namespace, name)

    def get_data_source(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if not self._visible(namespace, GROUP, "datasources", name):
            return None
        return self.inner.get_data_source(namespace, name)

    def claim_adoption_enabled(self) -> bool:
        return self.inner.claim_adoption_enabled()


def access_review(
    user: UserInfo, namespace: str, group: str, resource: str, name: str
) -> dict[str, Any]:
    """The SubjectAccessReview body asking whether ``user`` may get the object."""
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            **review_subject(user),
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "get",
                "group": group,
                "resource": resource,
                "name": name,
            },
        },
    }
