"""Admission answers reveal nothing about other namespaces' objects the requester cannot read:
the message is the same whether the clone source or DataSource exists or not, and the webhook
does not even look it up; a requester who may read it gets CDI's full answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from cdi.webhooks.mutation import UserInfo
from cdi.webhooks.server import validate_review
from cdi.webhooks.validation import StaticLookup
from cdi.webhooks.visibility import access_review


@dataclass
class Grants:
    """An authorizer over a fixed set of (user, namespace, resource, name) grants."""

    allowed: set[tuple[str, str, str, str]] = field(default_factory=set)
    asked: list[tuple[str, str, str, str]] = field(default_factory=list)
    broken: bool = False

    def can_read(
        self, user: UserInfo, namespace: str, group: str, resource: str, name: str
    ) -> bool:
        key = (user.username, namespace, resource, name)
        self.asked.append(key)
        if self.broken:
            raise OSError("API server unreachable")
        return key in self.allowed

    def allows(self, *_: Any) -> bool:
        return True  # clone rights granted: these tests are about what the rules may read


class CountingLookup:
    """A ``StaticLookup`` that remembers which PVCs the webhook read."""

    def __init__(self, **objects: Any) -> None:
        self.inner = StaticLookup(**objects)
        self.reads: list[tuple[str, str]] = []

    def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads.append((namespace, name))
        return self.inner.get_pvc(namespace, name)

    def get_data_source(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.inner.get_data_source(namespace, name)

    def claim_adoption_enabled(self) -> bool:
        return False


SECRET_PVC = {
    "metadata": {
        "name": "payroll",
        "namespace": "finance",
        "annotations": {"cdi.kubevirt.io/storage.contentType": "archive"},
    },
    "spec": {"resources": {"requests": {"storage": "50Gi"}}},
}
GOLDEN_DS = {"spec": {"source": {"pvc": {"namespace": "finance", "name": "payroll"}}}}


def review(source: Mapping[str, Any], user: str = "mallory") -> dict[str, Any]:
    dv = {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": "dv", "namespace": "tenant"},
        "spec": {
            **source,
            "pvc": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    }
    return {
        "uid": "r1",
        "operation": "CREATE",
        "namespace": "tenant",
        "object": dv,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
    }


def answer(out: Mapping[str, Any]) -> tuple[bool, str]:
    response = out["response"]
    return bool(response["allowed"]), str((response.get("status") or {}).get("message", ""))


CLONE = {"source": {"pvc": {"namespace": "finance", "name": "payroll"}}}
SOURCE_REF = {"sourceRef": {"kind": "DataSource", "name": "golden", "namespace": "finance"}}


@pytest.mark.parametrize("source", [CLONE, SOURCE_REF], ids=["clone pvc", "sourceRef"])
def test_same_answer_whether_the_foreign_object_exists_or_not(source: Mapping[str, Any]) -> None:
    present = CountingLookup(
        pvcs={("finance", "payroll"): SECRET_PVC}, data_sources={("finance", "golden"): GOLDEN_DS}
    )
    absent = CountingLookup()
    grants = Grants()
    with_object = answer(validate_review(review(source), present, grants, grants))
    without = answer(validate_review(review(source), absent, grants, grants))
    assert with_object == without
    assert "payroll" not in with_object[1] and "50Gi" not in with_object[1]
    assert ("finance", "payroll") not in present.reads  # not even looked up
    assert grants.asked  # a SubjectAccessReview decided


def test_a_requester_who_may_read_the_source_gets_cdis_answer() -> None:
    lookup = CountingLookup(pvcs={("finance", "payroll"): SECRET_PVC})
    grants = Grants({("alice", "finance", "persistentvolumeclaims", "payroll")})
    allowed, message = answer(validate_review(review(CLONE, "alice"), lookup, grants, grants))
    assert not allowed
    assert message == "Source contentType (archive) and target contentType (kubevirt) do not match"


def test_no_authorizer_or_a_failing_one_reveals_nothing() -> None:
    # Without clone rights the answer is clone authorization's, which names no object either.
    denied = (False, "User alice has insufficient permissions in clone source namespace finance")
    lookup = CountingLookup(pvcs={("finance", "payroll"): SECRET_PVC})
    assert answer(validate_review(review(CLONE, "alice"), lookup)) == denied
    broken = Grants({("alice", "finance", "persistentvolumeclaims", "payroll")}, broken=True)
    assert answer(validate_review(review(CLONE, "alice"), lookup, broken, broken)) == (True, "")
    assert set(lookup.reads) == {("tenant", "dv")}  # only the target claim, in the DV's namespace


def test_the_access_review_asks_about_get_on_that_object() -> None:
    body = access_review(UserInfo("bob", ("devs",)), "finance", "", "persistentvolumeclaims", "p")
    assert body["spec"] == {
        "user": "bob",
        "groups": ["devs"],
        "resourceAttributes": {
            "namespace": "finance",
            "verb": "get",
            "group": "",
            "resource": "persistentvolumeclaims",
            "name": "p",
        },
    }
