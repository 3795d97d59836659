"""Upload tokens and signing keys: CDI's payload, expiry, binding, rotation, tampering."""

from __future__ import annotations

import base64
import datetime as dt
import json

import jwt
import pytest

from cdi.upload.errors import BadUploadRequest, InvalidToken
from cdi.upload.keys import KeyRing, MemoryKeyStore, StoreConflict, ensure_ring, new_key
from cdi.upload.token import LIFETIME, UploadGrant, issue, verify

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
GRANT = UploadGrant("tenant", "disk", "uid-1")


@pytest.fixture(scope="module")
def ring() -> KeyRing:
    return KeyRing(new_key(T0))


def test_a_fresh_token_carries_cdis_payload_and_our_uid(ring: KeyRing) -> None:
    token = issue(ring, GRANT, T0)
    payload = jwt.decode(token, options={"verify_signature": False})
    assert payload["iss"] == "cdi-apiserver"
    assert payload["exp"] - payload["iat"] == 300
    assert payload["operation"] == "Upload"
    assert (payload["name"], payload["namespace"]) == ("disk", "tenant")
    assert payload["resource"] == {
        "group": "",
        "version": "v1",
        "resource": "persistentvolumeclaims",
    }
    assert payload["params"] == {"uid": "uid-1"}
    assert jwt.get_unverified_header(token)["alg"] == "PS256"
    assert verify(token, ring.public_keys(), T0) == GRANT


def test_a_token_expires_after_five_minutes_plus_leeway(ring: KeyRing) -> None:
    token = issue(ring, GRANT, T0)
    assert verify(token, ring.public_keys(), T0 + LIFETIME + dt.timedelta(seconds=9)) == GRANT
    with pytest.raises(InvalidToken, match="expired"):
        verify(token, ring.public_keys(), T0 + LIFETIME + dt.timedelta(seconds=11))


def test_a_token_from_the_future_is_refused(ring: KeyRing) -> None:
    token = issue(ring, GRANT, T0 + dt.timedelta(minutes=1))
    with pytest.raises(InvalidToken, match="not valid yet"):
        verify(token, ring.public_keys(), T0)


def test_a_token_names_its_pvc_and_uid_so_callers_can_refuse_another(ring: KeyRing) -> None:
    grant = verify(issue(ring, GRANT, T0), ring.public_keys(), T0)
    assert grant != UploadGrant("tenant", "other", "uid-1")
    assert grant != UploadGrant("tenant", "disk", "uid-2")  # re-created PVC, same name


def _tamper(token: str, **changes: object) -> str:
    head, body, sig = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload.update(changes)
    raw = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"{head}.{raw}.{sig}"


def test_a_tampered_payload_is_refused(ring: KeyRing) -> None:
    token = _tamper(issue(ring, GRANT, T0), name="someone-elses-disk")
    with pytest.raises(InvalidToken, match="signature"):
        verify(token, ring.public_keys(), T0)


def test_garbage_and_foreign_keys_are_refused(ring: KeyRing) -> None:
    with pytest.raises(InvalidToken):
        verify("abc", ring.public_keys(), T0)
    other = KeyRing(new_key(T0))
    with pytest.raises(InvalidToken, match="unknown key"):
        verify(issue(other, GRANT, T0), ring.public_keys(), T0)


def test_a_token_signed_with_hs256_by_the_public_key_is_refused(ring: KeyRing) -> None:
    """The classic algorithm-confusion attack: HMAC keyed with the public PEM."""
    public = ring.current.public_pem()
    forged = jwt.encode(
        {"iss": "cdi-apiserver", "exp": 2**40, "operation": "Upload"},
        public.decode()[:32],
        algorithm="HS256",
        headers={"kid": ring.current.kid},
    )
    with pytest.raises(InvalidToken):
        verify(forged, ring.public_keys(), T0)


def test_a_valid_token_for_another_operation_is_a_bad_request(ring: KeyRing) -> None:
    key = ring.current
    payload = {"iss": "cdi-apiserver", "exp": int(T0.timestamp()) + 60, "operation": "Clone"}
    token = jwt.encode(payload, key.private_key(), "PS256", headers={"kid": key.kid})
    with pytest.raises(BadUploadRequest):
        verify(token, ring.public_keys(), T0)


def test_a_store_gets_a_ring_once_and_keeps_it_until_rotation_is_due() -> None:
    store = MemoryKeyStore()
    first = ensure_ring(store, T0)
    assert ensure_ring(store, T0 + dt.timedelta(days=6)) == first
    assert len(store.writes) == 1


def test_rotation_keeps_the_previous_key_for_verification() -> None:
    store = MemoryKeyStore()
    old = ensure_ring(store, T0)
    token = issue(old, GRANT, T0 + dt.timedelta(days=7) - dt.timedelta(seconds=1))
    new = ensure_ring(store, T0 + dt.timedelta(days=7))
    assert new.current.kid != old.current.kid and new.previous == old.current
    assert verify(token, new.public_keys(), T0 + dt.timedelta(days=7)) == GRANT
    newer = ensure_ring(store, T0 + dt.timedelta(days=14))
    with pytest.raises(InvalidToken, match="unknown key"):
        verify(token, newer.public_keys(), T0 + dt.timedelta(days=7))


def test_a_stale_write_conflicts_so_racing_replicas_converge() -> None:
    store = MemoryKeyStore()
    ring, version = store.read()
    ensure_ring(store, T0)  # another replica wins
    with pytest.raises(StoreConflict):
        store.write(KeyRing(new_key(T0)), version)
    assert ring is None and ensure_ring(store, T0) == store.ring
