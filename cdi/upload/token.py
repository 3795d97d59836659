"""Upload tokens: CDI's JWT (PS256, issuer ``cdi-apiserver``, 5 minutes), bound to a PVC's UID.

The payload is CDI's (``pkg/token/token.go``) so a CDI client sees the same shape::

    {"iss": "cdi-apiserver", "iat": ..., "nbf": ..., "exp": iat + 300,
     "operation": "Upload", "name": <pvc>, "namespace": <ns>,
     "resource": {"group": "", "version": "v1", "resource": "persistentvolumeclaims"},
     "params": {"uid": <pvc uid>}}

``params`` is CDI's free-form map (clone tokens use it); we put the PVC's UID there so a PVC
deleted and re-created under the same name refuses a token issued for the old one. The
header names the signing key (``kid``) so verification picks it from the ring's public keys
(current and previous, ``keys.py``).

PyJWT checks signatures; the time claims are checked here against an injected ``now`` (PyJWT
would read the wall clock), with CDI's 10 s leeway. Every failure is a typed error:
``InvalidToken`` (401: signature, key, issuer, time) or ``BadUploadRequest`` (400: a valid
token that is not an upload token), the split CDI's proxy makes.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from cdi.upload.errors import BadUploadRequest, InvalidToken, UnknownSigningKey
from cdi.upload.keys import KeyRing

ISSUER = "cdi-apiserver"
ALGORITHM = "PS256"
LIFETIME = dt.timedelta(minutes=5)
LEEWAY = dt.timedelta(seconds=10)
OPERATION_UPLOAD = "Upload"
PVC_RESOURCE = {"group": "", "version": "v1", "resource": "persistentvolumeclaims"}


@dataclass(frozen=True)
class UploadGrant:
    """What a valid upload token allows: writing this PVC (this incarnation of it)."""

    namespace: str
    name: str
    uid: str


def issue(
    ring: KeyRing, grant: UploadGrant, now: dt.datetime, lifetime: dt.timedelta = LIFETIME
) -> str:
    issued = int(now.timestamp())
    payload = {
        "iss": ISSUER,
        "iat": issued,
        "nbf": issued,
        "exp": issued + int(lifetime.total_seconds()),
        "operation": OPERATION_UPLOAD,
        "name": grant.name,
        "namespace": grant.namespace,
        "resource": dict(PVC_RESOURCE),
        "params": {"uid": grant.uid},
    }
    key = ring.current
    return jwt.encode(payload, key.private_key(), algorithm=ALGORITHM, headers={"kid": key.kid})


def _signed_payload(token: str, public_keys: Mapping[str, bytes]) -> dict[str, Any]:
    try:
        kid = jwt.get_unverified_header(token).get("kid")
    except jwt.PyJWTError as exc:
        raise InvalidToken("the token is not a JWT") from exc
    pem = public_keys.get(str(kid))
    if pem is None:
        raise UnknownSigningKey("the token is signed with an unknown key")
    try:
        return dict(
            jwt.decode(
                token,
                pem,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False},
            )
        )
    except jwt.PyJWTError as exc:
        raise InvalidToken("the token's signature or issuer is invalid") from exc


def _check_times(payload: Mapping[str, Any], now: dt.datetime, leeway: dt.timedelta) -> None:
    t, slack = now.timestamp(), leeway.total_seconds()
    exp, nbf = payload.get("exp"), payload.get("nbf", payload.get("iat"))
    if not isinstance(exp, int | float) or t > exp + slack:
        raise InvalidToken("the token has expired")
    if isinstance(nbf, int | float) and t < nbf - slack:
        raise InvalidToken("the token is not valid yet")


def verify(
    token: str,
    public_keys: Mapping[str, bytes],
    now: dt.datetime,
    leeway: dt.timedelta = LEEWAY,
) -> UploadGrant:
    """The grant a token carries, or ``InvalidToken`` / ``BadUploadRequest``."""
    payload = _signed_payload(token, public_keys)
    _check_times(payload, now, leeway)
    resource = payload.get("resource")
    params = payload.get("params")
    name, namespace = payload.get("name"), payload.get("namespace")
    if (
        payload.get("operation") != OPERATION_UPLOAD
        or not isinstance(name, str)
        or not name
        or not isinstance(namespace, str)
        or not namespace
        or not isinstance(resource, dict)
        or resource.get("resource") != PVC_RESOURCE["resource"]
    ):
        raise BadUploadRequest("the token is not an upload token for a PVC")
    uid = params.get("uid") if isinstance(params, dict) else None
    return UploadGrant(namespace, name, uid if isinstance(uid, str) else "")


PublicKeys = Mapping[str, bytes]


class Verifier:
    """``verify`` with public keys from ``load`` (a Secret read, say), cached; reloaded when
    a token names a key not in the cache (a rotation elsewhere), at most every
    ``min_reload`` seconds so garbage tokens cannot hammer the API server."""

    def __init__(
        self,
        load: Callable[[], Awaitable[PublicKeys]],
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        min_reload: float = 5.0,
    ) -> None:
        self.load = load
        self.clock = clock
        self.min_reload = min_reload
        self._keys: PublicKeys = {}
        self._loaded_at = float("-inf")

    async def _reload(self) -> bool:
        if time.monotonic() - self._loaded_at < self.min_reload:
            return False
        self._keys = await self.load()
        self._loaded_at = time.monotonic()
        return True

    async def __call__(self, token: str) -> UploadGrant:
        if not self._keys:
            await self._reload()
        try:
            return verify(token, self._keys, self.clock())
        except UnknownSigningKey:
            if not await self._reload():
                raise
            return verify(token, self._keys, self.clock())
