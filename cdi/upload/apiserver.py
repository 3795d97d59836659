"""The aggregated API server for ``upload.cdi.kubevirt.io``: an aiohttp app factory.

The kube-apiserver forwards requests for our group here (APIService
``v1beta1.upload.cdi.kubevirt.io``) over TLS with its front-proxy client certificate and the
caller's identity in ``X-Remote-*`` headers. Routes:

- discovery: ``GET /apis`` (APIGroupList), ``/apis/upload.cdi.kubevirt.io`` (APIGroup),
  ``/apis/upload.cdi.kubevirt.io/v1beta1`` (APIResourceList: ``uploadtokenrequests``, short
  names ``utr``/``utrs``, namespaced, verb ``create`` only), open like CDI's;
- ``GET /healthz`` (and ``/readyz``, ``/livez``): ``ok``;
- ``POST /apis/upload.cdi.kubevirt.io/v1beta1/namespaces/{namespace}/uploadtokenrequests``:
  ``TokenApi.create`` (``tokenapi.py``) with the user from ``user_from_headers``.

The peer certificate's CN is read from the TLS transport; the chain was already verified
against the requestheader CA by the serving context
(``cdi.pki.contexts.serving_context(client_ca=...)``),
so a caller without such a certificate is simply unauthenticated. Bodies are small JSON
documents, read whole under a 64 KiB cap.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cdi.upload.tokenapi import (
    GROUP,
    KIND,
    RESOURCE,
    VERSION,
    RequestHeaderConfig,
    TokenApi,
    user_from_headers,
)

MAX_BODY = 64 * 1024
GROUP_VERSION = f"{GROUP}/{VERSION}"
_HEADERS = {"X-Content-Type-Options": "nosniff"}


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


def api_resources() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": RESOURCE,
                "singularName": "uploadtokenrequest",
                "namespaced": True,
                "kind": KIND,
                "verbs": ["create"],
                "shortNames": ["utr", "utrs"],
            }
        ],
    }


def peer_common_name(request: web.Request) -> str | None:
    cert: Any = request.transport.get_extra_info("peercert") if request.transport else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def make_api_app(api: TokenApi, requestheader: RequestHeaderConfig) -> web.Application:
    async def groups(_: web.Request) -> web.Response:
        listing = {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}
        return web.json_response(listing, headers=_HEADERS)

    async def group(_: web.Request) -> web.Response:
        return web.json_response(api_group(), headers=_HEADERS)

    async def resources(_: web.Request) -> web.Response:
        return web.json_response(api_resources(), headers=_HEADERS)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def create(request: web.Request) -> web.Response:
        user = user_from_headers(request.headers, peer_common_name(request), requestheader)
        body = await request.read()
        code, out = await api.create(user, request.match_info["namespace"], body)
        return web.json_response(out, status=code, headers=_HEADERS)

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_get("/apis", groups)
    app.router.add_get(f"/apis/{GROUP}", group)
    app.router.add_get(f"/apis/{GROUP}/{VERSION}", resources)
    app.router.add_post(f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{RESOURCE}", create)
    for path in ("/healthz", "/readyz", "/livez"):
        app.router.add_get(path, healthz)
    return app
