"""The UploadTokenRequest handler and front-proxy identity, pure (no server)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from multidict import CIMultiDict

from cdi.upload.keys import KeyRing, new_key
from cdi.upload.token import UploadGrant, verify
from cdi.upload.tokenapi import (
    Decision,
    RequestHeaderConfig,
    TokenApi,
    User,
    access_review,
    user_from_headers,
)

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
ALICE = User("alice", ("devs", "system:authenticated"), {"scopes": ("a", "b")})


@dataclass
class Rbac:
    """Who may create upload tokens where; records the users it was asked about."""

    allowed: set[tuple[str, str]] = field(default_factory=set)
    asked: list[tuple[User, str]] = field(default_factory=list)

    async def review(self, user: User, namespace: str) -> Decision:
        self.asked.append((user, namespace))
        if (user.name, namespace) in self.allowed:
            return Decision(True)
        return Decision(False, "no RBAC policy matched")


@dataclass
class Pvcs:
    items: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.items.get(f"{namespace}/{name}")


@pytest.fixture(scope="module")
def ring() -> KeyRing:
    return KeyRing(new_key(T0))


@pytest.fixture
def api(ring: KeyRing) -> TokenApi:
    async def current() -> KeyRing:
        return ring

    pvcs = Pvcs({"tenant/disk": {"metadata": {"name": "disk", "uid": "uid-1"}}})
    return TokenApi(Rbac({("alice", "tenant")}), pvcs, current, clock=lambda: T0)


def body(**spec: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "upload.cdi.kubevirt.io/v1beta1",
            "kind": "UploadTokenRequest",
            "metadata": {"generateName": "token-for-virtctl-"},
            "spec": spec,
        }
    ).encode()


async def test_an_allowed_user_gets_the_request_back_with_a_token_bound_to_the_pvc(
    api: TokenApi, ring: KeyRing
) -> None:
    code, out = await api.create(ALICE, "tenant", body(pvcName="disk"))
    assert code == 201
    assert out["metadata"] == {"generateName": "token-for-virtctl-", "namespace": "tenant"}
    assert out["spec"] == {"pvcName": "disk"}
    grant = verify(out["status"]["token"], ring.public_keys(), T0)
    assert grant == UploadGrant("tenant", "disk", "uid-1")


async def test_no_user_is_401_not_authenticated(api: TokenApi) -> None:
    code, out = await api.create(None, "tenant", body(pvcName="disk"))
    assert (code, out["message"], out["kind"]) == (401, "request is not authenticated", "Status")


async def test_a_user_without_the_right_is_forbidden_and_gets_no_token(api: TokenApi) -> None:
    code, out = await api.create(User("mallory"), "tenant", body(pvcName="disk"))
    assert (code, out["reason"]) == (403, "Forbidden")
    assert 'User "mallory" cannot create resource "uploadtokenrequests"' in out["message"]
    assert "token" not in json.dumps(out).replace("uploadtokenrequests", "")


async def test_the_right_is_per_namespace(api: TokenApi) -> None:
    code, _ = await api.create(ALICE, "other", body(pvcName="disk"))
    assert code == 403


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"kind": "Pod"}', body(), body(pvcName="")])
async def test_a_malformed_body_is_400(api: TokenApi, raw: bytes) -> None:
    code, out = await api.create(ALICE, "tenant", raw)
    assert (code, out["reason"]) == (400, "BadRequest")


async def test_a_missing_pvc_is_404_since_the_token_binds_its_uid(api: TokenApi) -> None:
    code, out = await api.create(ALICE, "tenant", body(pvcName="nope"))
    assert (code, out["message"]) == (404, 'persistentvolumeclaims "nope" not found')


def test_the_access_review_asks_for_create_uploadtokenrequests_in_the_namespace() -> None:
    review = access_review(ALICE, "tenant")
    assert review["spec"]["user"] == "alice"
    assert review["spec"]["groups"] == ["devs", "system:authenticated"]
    assert review["spec"]["extra"] == {"scopes": ["a", "b"]}
    assert review["spec"]["resourceAttributes"] == {
        "namespace": "tenant",
        "verb": "create",
        "group": "upload.cdi.kubevirt.io",
        "version": "v1beta1",
        "resource": "uploadtokenrequests",
    }


def _headers() -> CIMultiDict[str]:
    h: CIMultiDict[str] = CIMultiDict()
    h.add("X-Remote-User", "alice")
    h.add("X-Remote-Group", "devs")
    h.add("X-Remote-Group", "system:authenticated")
    h.add("X-Remote-Extra-Scopes", "a")
    h.add("X-Remote-Extra-Scopes", "b")
    return h


def test_front_proxy_headers_name_the_user_when_the_cn_is_allowed() -> None:
    config = RequestHeaderConfig(allowed_names=("front-proxy-client",))
    assert user_from_headers(_headers(), "front-proxy-client", config) == ALICE


def test_front_proxy_headers_are_ignored_without_a_trusted_certificate() -> None:
    config = RequestHeaderConfig(allowed_names=("front-proxy-client",))
    assert user_from_headers(_headers(), None, config) is None
    assert user_from_headers(_headers(), "someone-else", config) is None


def test_any_cn_is_allowed_when_no_names_are_configured() -> None:
    assert user_from_headers(_headers(), "whoever", RequestHeaderConfig()) == ALICE


def test_no_user_header_is_no_user() -> None:
    h: CIMultiDict[str] = CIMultiDict({"X-Remote-Group": "devs"})
    assert user_from_headers(h, "front-proxy-client", RequestHeaderConfig()) is None


def test_extra_keys_are_percent_decoded_and_lowercased() -> None:
    h: CIMultiDict[str] = CIMultiDict(
        {"X-Remote-User": "bob", "X-Remote-Extra-Acme.com%2Fproject": "p1"}
    )
    user = user_from_headers(h, "front-proxy-client", RequestHeaderConfig())
    assert user is not None and user.extra == {"acme.com/project": ("p1",)}
