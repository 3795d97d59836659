"""Clone authorization at admission, CDI's rule: same namespace always; otherwise the requester
needs ``create datavolumes/source`` on the source, or ``create pods`` (PVC source), or ``create
pods`` and ``create persistentvolumeclaims`` (snapshot source), in the source namespace."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from cdi.api.cloneauth import AccessCheck, access_review_body, clone_checks
from cdi.webhooks.mutation import UserInfo
from cdi.webhooks.server import validate_review
from cdi.webhooks.validation import StaticLookup

DENIED = "User {u} has insufficient permissions in clone source namespace golden"


@dataclass
class Rights:
    """A reviewer over fixed (user, namespace, verb, resource[/sub]) grants; records asks."""

    granted: set[tuple[str, str, str, str]] = field(default_factory=set)
    asked: list[tuple[str, str, str, str]] = field(default_factory=list)

    def allows(self, user: UserInfo, namespace: str, check: AccessCheck) -> bool:
        res = f"{check.resource}/{check.subresource}" if check.subresource else check.resource
        key = (user.username, namespace, check.verb, res)
        self.asked.append(key)
        return key in self.granted

    def can_read(self, *_: Any) -> bool:
        return True


def review(spec_source: Mapping[str, Any], user: str = "alice") -> dict[str, Any]:
    dv = {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": "dv", "namespace": "tenant"},
        "spec": {**spec_source, "storage": {}},
    }
    return {"uid": "u", "operation": "CREATE", "namespace": "tenant", "object": dv,
            "userInfo": {"username": user, "groups": ["system:authenticated"]}}  # fmt: skip


def verdict(source: Mapping[str, Any], rights: Rights, lookup: Any = None) -> tuple[bool, str]:
    out = validate_review(review(source), lookup or StaticLookup(), rights, rights)["response"]
    return bool(out["allowed"]), str((out.get("status") or {}).get("message", ""))


PVC = {"source": {"pvc": {"namespace": "golden", "name": "fedora"}}}
SNAP = {"source": {"snapshot": {"namespace": "golden", "name": "fedora-snap"}}}
SAME = {"source": {"pvc": {"namespace": "tenant", "name": "mine"}}}


def test_same_namespace_needs_no_review() -> None:
    rights = Rights()
    assert verdict(SAME, rights) == (True, "")
    assert rights.asked == []


@pytest.mark.parametrize(
    ("source", "grants", "allowed"),
    [
        (PVC, set(), False),
        (PVC, {"datavolumes/source"}, True),
        (PVC, {"pods"}, True),
        (PVC, {"persistentvolumeclaims"}, False),
        (SNAP, {"datavolumes/source"}, True),
        (SNAP, {"pods"}, False),
        (SNAP, {"pods", "persistentvolumeclaims"}, True),
    ],
)
def test_cross_namespace_needs_cdis_rights_in_the_source_namespace(
    source: Mapping[str, Any], grants: set[str], allowed: bool
) -> None:
    rights = Rights({("alice", "golden", "create", g) for g in grants})
    got = verdict(source, rights)
    assert got == ((True, "") if allowed else (False, DENIED.format(u="alice")))


def test_rights_in_another_namespace_do_not_count() -> None:
    rights = Rights({("alice", "tenant", "create", "datavolumes/source")})
    assert verdict(PVC, rights) == (False, DENIED.format(u="alice"))


def test_a_sourceref_is_authorized_against_the_namespace_of_the_pvc_it_names() -> None:
    ds = {"spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}}}}
    lookup = StaticLookup(data_sources={("tenant", "fedora"): ds})
    ref = {"sourceRef": {"kind": "DataSource", "name": "fedora"}}
    assert verdict(ref, Rights(), lookup) == (False, DENIED.format(u="alice"))
    granted = Rights({("alice", "golden", "create", "datavolumes/source")})
    assert verdict(ref, granted, lookup) == (True, "")


def test_the_explicit_review_names_the_source_and_the_subresource() -> None:
    explicit = clone_checks(False, "fedora")[0][0]
    body = access_review_body(UserInfo("alice", ("devs",)), "golden", explicit)
    assert body["spec"]["resourceAttributes"] == {
        "namespace": "golden", "verb": "create", "group": "cdi.kubevirt.io",
        "resource": "datavolumes", "subresource": "source", "name": "fedora",
    }  # fmt: skip
    assert body["spec"]["user"] == "alice" and body["spec"]["groups"] == ["devs"]
    assert "uid" not in body["spec"] and "extra" not in body["spec"]  # none to pass


def test_a_datasource_the_requester_cannot_read_is_authorized_against_its_namespace() -> None:
    ref = {"sourceRef": {"kind": "DataSource", "name": "fedora", "namespace": "golden"}}
    assert verdict(ref, Rights()) == (False, DENIED.format(u="alice"))
    granted = Rights({("alice", "golden", "create", "datavolumes/source")})
    assert verdict(ref, granted)[1] != DENIED.format(u="alice")


def test_a_datasource_naming_another_is_resolved_one_level() -> None:
    inner = {"spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}}}}
    outer = {"spec": {"source": {"dataSource": {"namespace": "tenant", "name": "inner"}}}}
    lookup = StaticLookup(data_sources={("tenant", "inner"): inner, ("tenant", "outer"): outer})
    ref = {"sourceRef": {"kind": "DataSource", "name": "outer"}}
    granted = Rights({("alice", "golden", "create", "datavolumes/source")})
    assert verdict(ref, granted, lookup) == (True, "")
    assert verdict(ref, Rights(), lookup) == (False, DENIED.format(u="alice"))
