"""The aggregated API server on 127.0.0.1 over TLS: discovery, and UploadTokenRequest create
trusted only from a front proxy whose client certificate the requestheader CA signed."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from cdi.pki.certs import KeyPair, issue_client, issue_serving, new_ca
from cdi.pki.contexts import load_pair, serving_context
from cdi.upload.apiserver import make_api_app
from cdi.upload.keys import KeyRing, new_key
from cdi.upload.token import UploadGrant, verify
from cdi.upload.tokenapi import RequestHeaderConfig, TokenApi
from tests.component.upload_peers import NOW
from tests.unit.test_upload_token_api import Pvcs, Rbac, body

BASE = "/apis/upload.cdi.kubevirt.io/v1beta1"
IDENTITY = {"X-Remote-User": "alice", "X-Remote-Group": "devs"}


@dataclass
class Server:
    url: str
    serving_ca: KeyPair
    front_proxy: KeyPair
    intruder: KeyPair
    outsider: KeyPair
    ring: KeyRing

    def client(self, cert: KeyPair | None) -> aiohttp.ClientSession:
        ctx = ssl.create_default_context(cadata=self.serving_ca.cert_pem.decode())
        if cert is not None:
            load_pair(ctx, cert)
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))


@pytest.fixture(scope="module")
def pki() -> dict[str, KeyPair]:
    serving_ca, rh_ca, other_ca = (new_ca(n, NOW) for n in ("api-ca", "rh-ca", "other-ca"))
    return {
        "serving_ca": serving_ca,
        "serving": issue_serving(serving_ca, ("127.0.0.1",), NOW),
        "rh_ca": rh_ca,
        "front_proxy": issue_client(rh_ca, "front-proxy-client", NOW),
        "intruder": issue_client(rh_ca, "intruder", NOW),
        "outsider": issue_client(other_ca, "front-proxy-client", NOW),
    }


@pytest.fixture
async def server(pki: dict[str, KeyPair]) -> AsyncIterator[Server]:
    ring = KeyRing(new_key(NOW))

    async def current() -> KeyRing:
        return ring

    pvcs = Pvcs({"tenant/disk": {"metadata": {"name": "disk", "uid": "uid-1"}}})
    api = TokenApi(Rbac({("alice", "tenant")}), pvcs, current, clock=lambda: NOW)
    app = make_api_app(api, RequestHeaderConfig(allowed_names=("front-proxy-client",)))
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = serving_context(pki["serving"], client_ca=pki["rh_ca"].cert_pem)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Server(
            f"https://127.0.0.1:{port}",
            pki["serving_ca"],
            pki["front_proxy"],
            pki["intruder"],
            pki["outsider"],
            ring,
        )
    finally:
        await runner.cleanup()


async def _create(server: Server, cert: KeyPair | None, ns: str = "tenant") -> tuple[int, dict]:
    url = f"{server.url}{BASE}/namespaces/{ns}/uploadtokenrequests"
    async with (
        server.client(cert) as s,
        s.post(url, data=body(pvcName="disk"), headers=IDENTITY) as r,
    ):
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        return r.status, json.loads(await r.text())


async def test_discovery_lists_the_group_version_and_the_create_only_resource(
    server: Server,
) -> None:
    async with server.client(None) as s:
        async with s.get(server.url + "/apis") as r:
            groups = await r.json()
        async with s.get(server.url + "/apis/upload.cdi.kubevirt.io") as r:
            group = await r.json()
        async with s.get(server.url + BASE) as r:
            resources = await r.json()
        async with s.get(server.url + "/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok")
    assert (
        groups["groups"][0]["preferredVersion"]["groupVersion"] == "upload.cdi.kubevirt.io/v1beta1"
    )
    assert group["name"] == "upload.cdi.kubevirt.io"
    (resource,) = resources["resources"]
    assert (resource["name"], resource["kind"], resource["verbs"]) == (
        "uploadtokenrequests",
        "UploadTokenRequest",
        ["create"],
    )
    assert resource["namespaced"] is True and resource["shortNames"] == ["utr", "utrs"]


async def test_the_front_proxy_gets_a_token_for_an_allowed_user(server: Server) -> None:
    code, out = await _create(server, server.front_proxy)
    assert code == 201
    grant = verify(out["status"]["token"], server.ring.public_keys(), NOW)
    assert grant == UploadGrant("tenant", "disk", "uid-1")


async def test_identity_headers_without_a_client_certificate_are_not_trusted(
    server: Server,
) -> None:
    code, out = await _create(server, None)
    assert (code, out["message"]) == (401, "request is not authenticated")


async def test_a_certificate_with_a_cn_not_allowed_is_not_trusted(server: Server) -> None:
    code, _ = await _create(server, server.intruder)
    assert code == 401


async def test_a_client_certificate_from_another_ca_is_refused_at_the_handshake(
    server: Server,
) -> None:
    with pytest.raises(aiohttp.ClientError):
        await _create(server, server.outsider)


async def test_a_user_without_the_right_is_forbidden(server: Server) -> None:
    code, out = await _create(server, server.front_proxy, ns="elsewhere")
    assert (code, out["reason"]) == (403, "Forbidden")
