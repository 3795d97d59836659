"""Admission answers reveal nothing about objects the requester cannot read: the message is the
same whether the clone source or DataSource exists or not, and the webhook does not even look
it up; a requester who may read it gets CDI's full answer. The namespace is the admission
request's (the API server's), and the own namespace is checked like any other (N2)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from cdi.api.requester import RequesterSigner, trusted_requester
from cdi.webhooks.mutation import UserInfo, apply_patch
from cdi.webhooks.server import mutate_review, validate_review
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


NOW = datetime(2026, 12, 1, 22, 0, 0, tzinfo=UTC)
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
    assert lookup.reads == []  # not even the target claim in the DV's own namespace


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


# --- N2 (issue 23): the API server's namespace, and no shortcut for it ----------------------


def test_a_review_is_judged_in_the_request_namespace_not_the_objects() -> None:
    # The object claims to live in "finance"; the API server says the request is in "tenant".
    forged = review({"source": {"blank": {}}}, "mallory")
    forged["object"]["metadata"] = {"name": "payroll", "namespace": "finance"}
    lookup = CountingLookup(pvcs={("finance", "payroll"): SECRET_PVC})
    grants = Grants({("mallory", "tenant", "persistentvolumeclaims", "payroll")})
    assert answer(validate_review(forged, lookup, grants, grants)) == (True, "")
    assert lookup.reads == [("tenant", "payroll")]  # finance's claim was never looked at
    assert all(ns == "tenant" for _, ns, _, _ in grants.asked)


def test_the_own_namespace_is_checked_by_an_access_review_too() -> None:
    # mallory may create DataVolumes in "tenant" but not read its claims: the existing claim
    # stays invisible to her, exactly as one in another namespace.
    lookup = CountingLookup(pvcs={("tenant", "dv"): {"metadata": {"name": "dv"}}})
    grants = Grants()
    assert answer(validate_review(review({"source": {"blank": {}}}), lookup, grants, grants)) == (
        True,
        "",
    )
    assert ("mallory", "tenant", "persistentvolumeclaims", "dv") in grants.asked
    assert lookup.reads == []
    reader = Grants({("mallory", "tenant", "persistentvolumeclaims", "dv")})
    allowed, message = answer(validate_review(review({"source": {"blank": {}}}), lookup, reader))
    assert (allowed, message) == (False, "Destination PVC tenant/dv already exists")


def test_the_requester_is_signed_for_the_request_namespace() -> None:
    signer = RequesterSigner(b"k" * 32, clock=lambda: NOW)
    forged = review({"source": {"blank": {}}}, "mallory")
    forged["object"]["metadata"] = {"name": "dv", "namespace": "finance"}
    patch = mutate_review(forged, signer)["response"]["patch"]
    stored = apply_patch(forged["object"], json.loads(base64.b64decode(patch)))
    stored["metadata"]["creationTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert trusted_requester(stored, b"k" * 32) is None  # not valid in "finance"
    stored["metadata"]["namespace"] = "tenant"
    assert trusted_requester(stored, b"k" * 32) == UserInfo("mallory", ("system:authenticated",))
