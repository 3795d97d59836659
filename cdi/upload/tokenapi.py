"""The ``UploadTokenRequest`` API (``upload.cdi.kubevirt.io/v1beta1``, create only), pure.

``TokenApi.create(user, namespace, body)`` is the whole request: the front proxy's user (or
None: 401 ``request is not authenticated``), a SubjectAccessReview for ``create
uploadtokenrequests`` in the namespace through the injected ``AccessReviewer`` (denied: 403
Forbidden with the review's reason, which is what ``kubectl`` and the issue expect; CDI
itself answers 401), the body decoded (400 when it is not an UploadTokenRequest with
``spec.pvcName``), the PVC found through the injected lookup (404 when missing: the token is
bound to the PVC's UID, so unlike CDI we need the PVC at issue time), and the request echoed
back with ``status.token``. Errors are Kubernetes ``Status`` objects, so ``kubectl`` and
client libraries print them as they print the API server's own.

Identity (``User``) comes from the front proxy's request headers; ``user_from_headers`` trusts
them only when the caller presented a client certificate verified against the requestheader
CA (the TLS layer checks the chain, ``cdi.pki.contexts.serving_context``) whose CN is allowed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from cdi.upload.keys import KeyRing
from cdi.upload.token import UploadGrant, issue

GROUP = "upload.cdi.kubevirt.io"
VERSION = "v1beta1"
KIND = "UploadTokenRequest"
RESOURCE = "uploadtokenrequests"
JSON = dict[str, Any]


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestHeaderConfig:
    """The API server's ``--requestheader-*`` settings (from ``extension-apiserver-
    authentication`` or flags)."""

    allowed_names: tuple[str, ...] = ()  # empty: any CN the CA signed
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)


def user_from_headers(
    headers: Mapping[str, str] | Any, peer_cn: str | None, config: RequestHeaderConfig
) -> User | None:
    """The authenticated user, or None when the caller is not a trusted front proxy or names
    no user. ``headers`` is a multidict (``getall``) or a plain mapping."""
    if peer_cn is None or (config.allowed_names and peer_cn not in config.allowed_names):
        return None
    get_all = getattr(headers, "getall", lambda k, d: [headers[k]] if k in headers else d)
    name = next((v for h in config.username_headers for v in get_all(h, []) if v), "")
    if not name:
        return None
    groups = tuple(v for h in config.group_headers for v in get_all(h, []))
    extra: dict[str, tuple[str, ...]] = {}
    for key in headers:
        for prefix in config.extra_prefixes:
            if key.lower().startswith(prefix.lower()):
                extra_key = unquote(key[len(prefix) :]).lower()
                extra[extra_key] = extra.get(extra_key, ()) + tuple(get_all(key, []))
    return User(name, groups, extra)


class LookupFailed(Exception):
    """The cluster could not answer a review or a PVC lookup (the caller gets a 500)."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class AccessReviewer(Protocol):
    async def review(self, user: User, namespace: str) -> Decision:
        """A SubjectAccessReview for ``create uploadtokenrequests`` in ``namespace``;
        ``LookupFailed`` when the API server cannot answer."""
        ...


class PvcLookup(Protocol):
    async def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The PVC, None if it does not exist, ``LookupFailed`` if the cluster cannot say."""
        ...


def access_review(user: User, namespace: str) -> JSON:
    """The SubjectAccessReview a ``KubeAccessReviewer`` creates (pure, for tests and logs)."""
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user.name,
            "groups": list(user.groups),
            "extra": {k: list(v) for k, v in user.extra.items()},
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "create",
                "group": GROUP,
                "version": VERSION,
                "resource": RESOURCE,
            },
        },
    }


def status(code: int, reason: str, message: str) -> JSON:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"group": GROUP, "kind": RESOURCE},
        "code": code,
    }


def _decode(body: bytes) -> tuple[JSON | None, str]:
    try:
        obj = json.loads(body or b"null")
    except ValueError as exc:
        return None, f"the body is not JSON: {exc}"
    if not isinstance(obj, dict) or obj.get("kind", KIND) != KIND:
        return None, f"the body is not an {KIND}"
    pvc = (obj.get("spec") or {}).get("pvcName") if isinstance(obj.get("spec"), dict) else None
    if not isinstance(pvc, str) or not pvc:
        return None, f"{KIND}.spec.pvcName is required"
    return obj, ""


@dataclass
class TokenApi:
    reviewer: AccessReviewer
    pvcs: PvcLookup
    ring: Callable[[], Awaitable[KeyRing]]
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    async def create(self, user: User | None, namespace: str, body: bytes) -> tuple[int, JSON]:
        try:
            return await self._create(user, namespace, body)
        except LookupFailed as exc:
            return 500, status(500, "InternalError", str(exc))

    async def _create(self, user: User | None, namespace: str, body: bytes) -> tuple[int, JSON]:
        if user is None:
            return 401, status(401, "Unauthorized", "request is not authenticated")
        decision = await self.reviewer.review(user, namespace)
        if not decision.allowed:
            message = (
                f'{RESOURCE}.{GROUP} is forbidden: User "{user.name}" cannot create resource '
                f'"{RESOURCE}" in API group "{GROUP}" in the namespace "{namespace}"'
            )
            if decision.reason:
                message += f": {decision.reason}"
            return 403, status(403, "Forbidden", message)
        obj, problem = _decode(body)
        if obj is None:
            return 400, status(400, "BadRequest", problem)
        pvc_name = obj["spec"]["pvcName"]
        pvc = await self.pvcs.get_pvc(namespace, pvc_name)
        uid = str(((pvc or {}).get("metadata") or {}).get("uid") or "")
        if not uid:
            message = f'persistentvolumeclaims "{pvc_name}" not found'
            return 404, status(404, "NotFound", message)
        token = issue(await self.ring(), UploadGrant(namespace, pvc_name, uid), self.clock())
        meta = {**(obj.get("metadata") or {}), "namespace": namespace}
        return 201, {
            **obj,
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": meta,
            "status": {"token": token},
        }
