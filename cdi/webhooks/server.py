"""The admission webhook HTTP server: AdmissionReview in, AdmissionReview out.

``make_app(lookup, run_blocking, authorizer)`` is an aiohttp app factory with three routes:

- ``POST /datavolume-validate``: ``validate_datavolume`` (the pure CDI rules) on the request's
  object and old object; a rejection is ``allowed: false`` with a 422 ``Status`` whose message
  is the causes' messages (the API server shows it after "denied the request:") and whose
  ``details.causes`` carry the fields; warnings travel either way. The rules see the cluster
  as the requester may (``cdi.webhooks.visibility``): objects in other namespaces exist for
  them only when a SubjectAccessReview (the ``authorizer``) says they may read them;
- ``POST /datavolume-mutate``: ``mutate_datavolume`` as a base64 JSON patch;
- ``POST /datasource-mutate``: ``mutate_datasource`` (``cdi.webhooks.datasource_mutation``: the
  signed requester record only) as a base64 JSON patch;
- ``POST /populator-validate``: ``validate_populator`` (``cdi.webhooks.populators``) on a
  ``VolumeImportSource`` being created or updated;
- ``POST /dataimportcron-validate``: ``validate_dataimportcron`` (``cdi.webhooks.dataimportcron``);
- ``POST /cdi-validate``: the CDI resource's ``BlockUninstallIfWorkloadsExist``
  (``cdi.webhooks.cdiresource``), with ``datavolumes_exist`` as its lookup;
- ``GET /healthz`` (and the same on its own plain-HTTP app, ``make_health_app``: the kubelet's
  probe has no client certificate).

Every request first passes ``caller`` (``cdi.webhooks.callers.ApiServerCaller``: the API
server's client certificate), else 403 before the body is read. The review's ``userInfo`` and
``namespace`` are then the API server's word; the object's ``metadata.namespace`` is not used.
A review that needs the cluster goes through ``FairLookups`` (``cdi.webhooks.fairness``) keyed
by the requesting user: one user's flood is refused (429 in the review's status), nobody else's
review waits behind it.

Nothing here knows Kubernetes clients or TLS files: cluster lookups come through the
``ClusterLookup`` protocol (they may block, so they run via ``run_blocking`` off the event
loop) and the TLS context is the caller's (``cdi.admission``). Admission reviews are small JSON
documents, so reading the whole body is right here.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from cdi.webhooks.cdiresource import uninstall_refusal
from cdi.webhooks.clone_auth import AccessReviewer, NoCrossNamespaceClones, authorize_clone
from cdi.webhooks.dataimportcron import validate_dataimportcron
from cdi.webhooks.datasource_mutation import mutate_datasource
from cdi.webhooks.fairness import CallerBusy, FairLookups
from cdi.webhooks.mutation import Signer, UserInfo, mutate_datavolume
from cdi.webhooks.populators import validate_populator
from cdi.webhooks.validation import ClusterLookup, validate_datavolume
from cdi.webhooks.verdict import ValidationResult
from cdi.webhooks.visibility import Authorizer, NoCrossNamespaceReads, RequesterLookup

log = logging.getLogger(__name__)

RunBlocking = Callable[..., Awaitable[Any]]
CallerCheck = Callable[[web.Request], bool]
Mutator = Callable[
    [Mapping[str, Any], Mapping[str, Any] | None, UserInfo, Signer | None, str],
    list[dict[str, Any]],
]
MAX_REVIEW_BYTES = 3 * 1024 * 1024
LOOKUP_WORKERS = 4  # make_app's default; cdi.admission passes its pool's size


def review_response(uid: str, **response: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, **response},
    }


def verdict_response(uid: str, verdict: ValidationResult) -> dict[str, Any]:
    if verdict.allowed:
        out = review_response(uid, allowed=True)
    else:
        status = {
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": "; ".join(verdict.messages),
            "details": {
                "causes": [
                    {"type": str(c.type), "message": c.message, "field": c.field}
                    for c in verdict.causes
                ]
            },
        }
        out = review_response(uid, allowed=False, status=status)
    if verdict.warnings:
        out["response"]["warnings"] = list(verdict.warnings)
    return out


def validate_review(
    request: Mapping[str, Any],
    lookup: ClusterLookup,
    authorizer: Authorizer | None = None,
    reviewer: AccessReviewer | None = None,
) -> dict[str, Any]:
    uid = str(request.get("uid", ""))
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return review_response(uid, allowed=True)
    new = request.get("object") or {}
    old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
    namespace = str(request.get("namespace") or "")  # the API server's, not the object's
    user = UserInfo.from_dict(request.get("userInfo") or {})
    seen = RequesterLookup(lookup, authorizer or NoCrossNamespaceReads(), user)
    if old is None:  # clone authorization first, as CDI's mutating webhook answers it first
        clones = reviewer or NoCrossNamespaceClones()
        denied = authorize_clone(new, namespace, user, seen, clones)
        if not denied.allowed:
            return verdict_response(uid, denied)
    verdict = validate_datavolume(new, old, seen, namespace=namespace)
    return verdict_response(uid, verdict)


def busy_response(uid: str, busy: CallerBusy) -> dict[str, Any]:
    """The review's answer when its user already has too many in progress."""
    status = {"status": "Failure", "code": 429, "reason": "TooManyRequests", "message": str(busy)}
    return review_response(uid, allowed=False, status=status)


def validate_cron_review(request: Mapping[str, Any]) -> dict[str, Any]:
    """A DataImportCron create or update (``cdi.webhooks.dataimportcron``)."""
    uid = str(request.get("uid", ""))
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return review_response(uid, allowed=True)
    old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
    namespace = str(request.get("namespace") or "")
    return verdict_response(
        uid, validate_dataimportcron(request.get("object") or {}, old, namespace)
    )


def populator_review(request: Mapping[str, Any]) -> dict[str, Any]:
    uid = str(request.get("uid", ""))
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return review_response(uid, allowed=True)
    old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
    return verdict_response(uid, validate_populator(request.get("object") or {}, old))


def mutate_review(
    request: Mapping[str, Any], signer: Signer | None = None, mutate: Mutator = mutate_datavolume
) -> dict[str, Any]:
    """``mutate``: the kind's mutation (DataVolumes by default, or ``mutate_datasource``)."""
    uid = str(request.get("uid", ""))
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return review_response(uid, allowed=True)
    old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
    patch = mutate(
        request.get("object") or {},
        old,
        UserInfo.from_dict(request.get("userInfo") or {}),
        signer,
        str(request.get("namespace") or ""),
    )
    if not patch:
        return review_response(uid, allowed=True)
    encoded = base64.b64encode(json.dumps(patch).encode()).decode()
    return review_response(uid, allowed=True, patchType="JSONPatch", patch=encoded)


async def _read_review(request: web.Request) -> Mapping[str, Any]:
    if (request.content_length or 0) > MAX_REVIEW_BYTES:
        raise web.HTTPRequestEntityTooLarge(
            max_size=MAX_REVIEW_BYTES, actual_size=request.content_length or 0
        )
    try:
        review = await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"not JSON: {exc}") from exc
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        raise web.HTTPBadRequest(text="not an AdmissionReview")
    return dict(review["request"])


def make_app(
    lookup: ClusterLookup,
    run_blocking: RunBlocking,
    authorizer: Authorizer | None = None,
    signer: Signer | None = None,
    reviewer: AccessReviewer | None = None,
    caller: CallerCheck | None = None,
    lookups: FairLookups | None = None,
    datavolumes_exist: Callable[[], bool] | None = None,
) -> web.Application:
    """``authorizer`` None: no requester may see any object. ``signer`` None: the requester
    record is written unsigned (the controller will not trust it for clones). ``reviewer``
    None: no cross-namespace clone is admitted. ``caller`` None: every caller is the API
    server (tests, and a webhook fenced by a NetworkPolicy instead, ``cdi.admission``).
    ``lookups`` None: a ``FairLookups`` of ``LOOKUP_WORKERS`` over ``run_blocking``.
    ``datavolumes_exist`` None: the CDI resource's uninstall is never blocked (blocking)."""
    fair = lookups or FairLookups(run_blocking, LOOKUP_WORKERS)

    @web.middleware
    async def api_server_only(request: web.Request, handler: Any) -> web.StreamResponse:
        if caller is not None and not caller(request):
            raise web.HTTPForbidden(text="this webhook answers the API server only\n")
        return await handler(request)

    async def validate(request: web.Request) -> web.Response:
        review = await _read_review(request)
        user = UserInfo.from_dict(review.get("userInfo") or {})
        try:
            verdict = await fair.run(
                user.username, validate_review, review, lookup, authorizer, reviewer
            )
        except CallerBusy as busy:
            verdict = busy_response(str(review.get("uid", "")), busy)
        return web.json_response(verdict)

    async def mutate(request: web.Request) -> web.Response:
        review = await _read_review(request)
        return web.json_response(mutate_review(review, signer))

    async def mutate_source(request: web.Request) -> web.Response:
        review = await _read_review(request)
        return web.json_response(mutate_review(review, signer, mutate_datasource))

    async def validate_cron(request: web.Request) -> web.Response:
        return web.json_response(validate_cron_review(await _read_review(request)))

    async def populator(request: web.Request) -> web.Response:
        return web.json_response(populator_review(await _read_review(request)))

    async def validate_cdi(request: web.Request) -> web.Response:
        review = await _read_review(request)
        exist = datavolumes_exist or (lambda: False)
        refusal = await run_blocking(uninstall_refusal, review, exist)
        uid = str(review.get("uid", ""))
        if refusal is None:
            return web.json_response(review_response(uid, allowed=True))
        status = {"status": "Failure", "code": 403, "reason": "Forbidden", "message": refusal}
        return web.json_response(review_response(uid, allowed=False, status=status))

    app = web.Application(client_max_size=MAX_REVIEW_BYTES, middlewares=[api_server_only])
    app.router.add_post("/datavolume-validate", validate)
    app.router.add_post("/datavolume-mutate", mutate)
    app.router.add_post("/datasource-mutate", mutate_source)
    app.router.add_post("/dataimportcron-validate", validate_cron)
    app.router.add_post("/populator-validate", populator)
    app.router.add_post("/cdi-validate", validate_cdi)
    app.router.add_get("/healthz", _healthz)
    return app


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_health_app() -> web.Application:
    """``GET /healthz`` alone, for the kubelet's probe on a port of its own."""
    app = web.Application()
    app.router.add_get("/healthz", _healthz)
    return app
