"""The upload proxy on 127.0.0.1 in front of a real TLS "upload server" peer: CDI's checks,
statuses and messages (each its own test), mutual TLS, CORS, HTML escaping, tus pass-through."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web

from cdi.api.constants import (
    ANN_CONTENT_TYPE,
    ANN_POD_PHASE,
    ANN_POD_READY,
    ANN_PVC_PRIME_NAME,
    ANN_UPLOAD_REQUEST,
)
from cdi.pki.certs import new_ca
from cdi.pki.contexts import upstream_context
from cdi.upload.proxy import UPLOAD_PATHS, ProxyConfig
from cdi.upload.proxyserver import UploadProxy
from cdi.upload.readiness import UploadServer
from cdi.upload.token import UploadGrant, Verifier, issue
from tests.component.upload_peers import NOW, Pki, UploadPeer, make_pki

NS = "tenant"


def pvc(name: str, uid: str = "", **annotations: str) -> dict[str, Any]:
    ann = {ANN_UPLOAD_REQUEST: "", ANN_POD_READY: "true", **annotations}
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid or f"uid-{name}",
            "annotations": ann,
        },
        "spec": {},
    }


@dataclass
class TableTargets:
    """The PVCs of the test and where each one's upload server listens."""

    pvcs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    hostnames: dict[str, str] = field(default_factory=dict)
    default_port: int = 0

    async def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pvcs.get(f"{namespace}/{name}")

    async def upload_server(self, namespace: str, pvc_name: str) -> UploadServer:
        port = self.ports.get(pvc_name, self.default_port)
        return UploadServer(f"https://127.0.0.1:{port}", self.hostnames.get(pvc_name))

    def add(self, obj: dict[str, Any]) -> None:
        self.pvcs[f"{NS}/{obj['metadata']['name']}"] = obj


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@dataclass
class Env:
    url: str
    peer: UploadPeer
    targets: TableTargets
    pki: Pki
    peer_ports: tuple[int, int]
    clock: list[dt.datetime]
    proxy: UploadProxy

    def token(self, name: str = "disk", uid: str = "", ns: str = NS) -> str:
        return issue(self.pki.ring, UploadGrant(ns, name, uid or f"uid-{name}"), self.clock[0])

    def session(self, **kw: Any) -> aiohttp.ClientSession:
        ctx = self.pki.client_trusting_proxy()
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx), **kw)


async def _start(
    app: web.Application, ctx: ssl.SSLContext, ports: int = 1
) -> tuple[web.AppRunner, list[int]]:
    runner = web.AppRunner(app)
    await runner.setup()
    found = []
    for _ in range(ports):
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        found.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    return runner, found


@pytest.fixture
async def env(pki: Pki) -> AsyncIterator[Env]:
    peer = UploadPeer()
    peer_runner, peer_ports = await _start(peer.app(), pki.peer_serving(), ports=2)
    targets = TableTargets(default_port=peer_ports[0])
    clock = [NOW]

    async def keys() -> Mapping[str, bytes]:
        return pki.ring.public_keys()

    verifier = Verifier(keys, clock=lambda: clock[0])
    config = ProxyConfig(ready_timeout=0.6, ready_interval=0.2, idle_timeout=1.0)
    proxy = UploadProxy(targets, verifier, pki.upstream(), config)
    port = await proxy.start("127.0.0.1", 0, pki.proxy_serving())
    try:
        yield Env(f"https://127.0.0.1:{port}", peer, targets, pki, tuple(peer_ports), clock, proxy)
    finally:
        await proxy.stop()
        await peer_runner.cleanup()


async def post(
    env: Env,
    path: str = "/v1beta1/upload",
    data: bytes = b"disk image",
    auth: str | None = "token",
    **headers: str,
) -> tuple[int, str, Mapping[str, str]]:
    if auth == "token":
        headers["Authorization"] = f"Bearer {env.token()}"
    elif auth is not None:
        headers["Authorization"] = auth
    async with env.session() as s, s.post(env.url + path, data=data, headers=headers) as r:
        return r.status, await r.text(), r.headers


# -- health and the token checks (400, 401, 400) --------------------------------------------


async def test_healthz_answers_ok_without_a_token(env: Env) -> None:
    async with env.session() as s, s.get(env.url + "/healthz") as r:
        assert (r.status, await r.text()) == (200, "OK")


async def test_no_authorization_header_is_400(env: Env) -> None:
    status, _, _ = await post(env, auth=None)
    assert status == 400 and env.peer.seen == []


async def test_an_authorization_header_that_is_not_bearer_is_400(env: Env) -> None:
    status, _, _ = await post(env, auth="Beereer valid")
    assert status == 400 and env.peer.seen == []


async def test_an_invalid_token_is_401(env: Env) -> None:
    status, _, _ = await post(env, auth="Bearer abc")
    assert status == 401 and env.peer.seen == []


async def test_an_expired_token_is_401(env: Env) -> None:
    env.targets.add(pvc("disk"))
    token = env.token()
    env.clock[0] = NOW + dt.timedelta(minutes=5, seconds=11)
    status, _, _ = await post(env, auth=f"Bearer {token}")
    assert status == 401 and env.peer.seen == []


async def test_a_valid_token_that_is_not_an_upload_token_is_400(env: Env) -> None:
    key = env.pki.ring.current
    payload = {
        "iss": "cdi-apiserver",
        "exp": int(NOW.timestamp()) + 60,
        "operation": "Clone",
        "name": "disk",
        "namespace": NS,
    }
    token = jwt.encode(payload, key.private_key(), "PS256", headers={"kid": key.kid})
    status, _, _ = await post(env, auth=f"Bearer {token}")
    assert status == 400 and env.peer.seen == []


# -- the PVC checks (503 with CDI's messages) ------------------------------------------------


async def test_a_missing_pvc_is_503_doesnt_exist(env: Env) -> None:
    status, body, _ = await post(env)
    assert status == 503
    assert body == "rejecting Upload Request for PVC disk that doesn&#x27;t exist"


async def test_a_pvc_that_is_not_an_upload_target_is_503(env: Env) -> None:
    obj = pvc("disk")
    del obj["metadata"]["annotations"][ANN_UPLOAD_REQUEST]
    env.targets.add(obj)
    assert (await post(env))[:2] == (503, "PVC disk is not an upload target")


async def test_a_pvc_that_finished_uploading_is_503(env: Env) -> None:
    env.targets.add(pvc("disk", **{ANN_POD_PHASE: "Succeeded"}))
    status, body, _ = await post(env)
    assert (status, body) == (
        503,
        "rejecting Upload Request for PVC disk that already finished uploading",
    )


async def test_an_upload_pod_never_ready_is_503_context_deadline_exceeded(env: Env) -> None:
    env.targets.add(pvc("disk", **{ANN_POD_READY: "false"}))
    assert (await post(env))[:2] == (503, "context deadline exceeded")
    assert env.peer.seen == []


async def test_a_populator_pvc_without_its_prime_is_503(env: Env) -> None:
    obj = pvc("disk")
    obj["spec"]["dataSourceRef"] = {"kind": "VolumeUploadSource", "name": "src"}
    env.targets.add(obj)
    status, body, _ = await post(env)
    assert (status, body) == (
        503,
        "rejecting Upload Request for PVC disk, PVC&#x27; wasn&#x27;t created yet",
    )


async def test_a_populator_pvc_uploads_into_its_prime(env: Env) -> None:
    obj = pvc("disk", **{ANN_PVC_PRIME_NAME: "prime-uid-disk"})
    obj["spec"]["dataSourceRef"] = {"kind": "VolumeUploadSource", "name": "src"}
    env.targets.add(obj)
    env.targets.add(pvc("prime-uid-disk"))
    env.targets.ports["prime-uid-disk"] = env.peer_ports[1]
    assert (await post(env))[0] == 200
    assert env.peer.seen[0].port == env.peer_ports[1]


async def test_an_invalid_content_type_is_503_and_html_escaped(env: Env) -> None:
    env.targets.add(pvc("disk", **{ANN_CONTENT_TYPE: "<script>alert(1)</script>"}))
    status, body, _ = await post(env)
    assert status == 503 and "<script>" not in body
    assert body == (
        "rejecting upload request for PVC disk - upload content-type "
        "&lt;script&gt;alert(1)&lt;/script&gt; is invalid"
    )


async def test_a_token_for_a_deleted_and_recreated_pvc_is_401(env: Env) -> None:
    env.targets.add(pvc("disk", uid="uid-second-incarnation"))
    status, _, _ = await post(env)  # the token names uid-disk
    assert status == 401 and env.peer.seen == []


async def test_a_token_for_pvc_a_writes_only_a(env: Env) -> None:
    env.targets.add(pvc("a"))
    env.targets.add(pvc("b"))
    env.targets.ports.update(a=env.peer_ports[0], b=env.peer_ports[1])
    status, _, _ = await post(env, auth=f"Bearer {env.token('a')}")
    assert status == 200
    assert [s.port for s in env.peer.seen] == [env.peer_ports[0]]


# -- relaying: paths, statuses, streaming, errors -------------------------------------------


@pytest.mark.parametrize("path", UPLOAD_PATHS)
@pytest.mark.parametrize("status", [200, 400, 409, 500, 503])
async def test_the_upload_servers_status_and_body_pass_through(
    env: Env, path: str, status: int
) -> None:
    env.targets.add(pvc("disk"))
    env.peer.replies[path] = (status, f"answer {status}", {"X-Peer": "yes"})
    got, body, headers = await post(
        env, path, data=b"x" * 100_000, Origin="https://ui", **{"X-Cdi-Content-Type": "x"}
    )
    assert (got, body, headers["X-Peer"]) == (status, f"answer {status}", "yes")
    assert headers["Access-Control-Allow-Origin"] == "*"
    seen = env.peer.seen[0]
    assert (seen.method, seen.path, seen.received, seen.complete) == ("POST", path, 100_000, True)
    assert seen.headers["Content-Length"] == "100000" and "Authorization" not in seen.headers
    assert "X-Cdi-Content-Type" not in seen.headers


@pytest.mark.parametrize(
    ("path", "archive_path"),
    [
        ("/v1beta1/upload", "/v1beta1/upload-archive"),
        ("/v1beta1/upload-async", "/v1beta1/upload-archive"),
        ("/v1alpha1/upload", "/v1alpha1/upload-archive"),
    ],
)
async def test_an_archive_pvc_is_sent_to_the_archive_endpoint(
    env: Env, path: str, archive_path: str
) -> None:
    env.targets.add(pvc("disk", **{ANN_CONTENT_TYPE: "archive"}))
    assert (await post(env, path))[0] == 200
    assert env.peer.seen[0].path == archive_path


async def test_an_unreachable_upload_server_is_502(env: Env) -> None:
    env.targets.add(pvc("disk"))
    env.targets.ports["disk"] = 1  # nothing listens on port 1
    status, body, _ = await post(env)
    assert status == 502
    assert body == (
        "error in upload-proxy: http: proxy error: dial tcp 127.0.0.1:1: "
        "connect: connection refused"
    )


async def test_the_upload_server_is_verified_by_its_service_name_on_an_address(
    env: Env,
) -> None:
    env.targets.add(pvc("disk"))
    env.targets.hostnames["disk"] = "cdi-upload-disk.tenant.svc"
    assert (await post(env))[0] == 200
    env.targets.hostnames["disk"] = "cdi-upload-other.tenant.svc"  # not in its certificate
    status, body, _ = await post(env)
    assert status == 502 and body.startswith("error in upload-proxy: http: proxy error:")
    assert len(env.peer.seen) == 1


async def test_head_and_patch_pass_through_for_tus_resume(env: Env) -> None:
    env.targets.add(pvc("disk"))
    env.peer.replies["/v1beta1/upload"] = (
        204,
        "",
        {"Upload-Offset": "4096", "Tus-Resumable": "1.0.0"},
    )
    auth = {"Authorization": f"Bearer {env.token()}", "Tus-Resumable": "1.0.0"}
    async with env.session() as s:
        async with s.head(env.url + "/v1beta1/upload", headers=auth) as r:
            assert (r.status, r.headers["Upload-Offset"]) == (204, "4096")
        patch = {**auth, "Upload-Offset": "4096", "Content-Type": "application/offset+octet-stream"}
        async with s.patch(env.url + "/v1beta1/upload", data=b"y" * 1000, headers=patch) as r:
            assert r.status == 204
    head, rest = env.peer.seen
    assert (head.method, rest.method, rest.received) == ("HEAD", "PATCH", 1000)
    assert rest.headers["Upload-Offset"] == "4096"


async def test_cors_preflight_is_answered_and_errors_carry_the_cors_header(env: Env) -> None:
    async with env.session() as s:
        headers = {
            "Origin": "https://ui",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        }
        async with s.options(env.url + "/v1beta1/upload", headers=headers) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "*"
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
    status, _, got = await post(env, auth=None, Origin="https://ui")
    assert status == 400 and got["Access-Control-Allow-Origin"] == "*"
    _, _, plain = await post(env, auth=None)
    assert "Access-Control-Allow-Origin" not in plain


async def test_the_upload_server_refuses_a_client_without_our_certificate(env: Env) -> None:
    ctx = ssl.create_default_context(cadata=env.pki.server_ca.cert_pem.decode())
    url = f"https://127.0.0.1:{env.peer_ports[0]}/v1beta1/upload"
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as s, s.post(url, data=b"x", ssl=ctx) as r:
            await r.read()
    assert env.peer.seen == []


async def test_a_stalled_body_ends_with_408_and_the_proxy_keeps_serving(env: Env) -> None:
    env.targets.add(pvc("disk"))

    async def trickle() -> AsyncIterator[bytes]:
        yield b"z" * 1000
        await asyncio.sleep(3)  # longer than the proxy's 1 s idle timeout
        yield b"z"

    status, _, _ = await post(env, data=trickle())  # type: ignore[arg-type]
    assert status == 408
    assert env.peer.seen[0].complete is False
    async with env.session() as s, s.get(env.url + "/healthz") as r:
        assert r.status == 200


async def test_a_cut_upload_reaches_the_server_cut_and_a_retry_with_the_same_token_works(
    env: Env,
) -> None:
    """CDI's "[test_id:1985] should succeed on retry after failure", at the proxy."""
    env.targets.add(pvc("disk"))
    token = env.token()
    host, port = env.url.removeprefix("https://").split(":")
    _, writer = await asyncio.open_connection(host, int(port), ssl=env.pki.client_trusting_proxy())
    head = (
        f"POST /v1beta1/upload HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Length: 10000000\r\n\r\n"
    )
    writer.write(head.encode() + b"c" * 1_000_000)
    await writer.drain()
    for _ in range(100):  # the relay has started: the peer is receiving
        if env.peer.seen and env.peer.seen[0].received:
            break
        await asyncio.sleep(0.05)
    writer.transport.abort()  # the client's connection is cut mid-body
    for _ in range(100):
        if env.peer.seen[0].ended:
            break
        await asyncio.sleep(0.05)
    cut = env.peer.seen[0]
    assert not cut.complete and 0 < cut.received < 10_000_000
    status, _, _ = await post(env, auth=f"Bearer {token}", data=b"d" * 1000)
    assert status == 200 and env.peer.seen[1].complete and env.peer.seen[1].received == 1000


async def test_a_server_ca_switched_before_the_proxys_reread_is_fetched_at_the_failed_dial(
    env: Env,
) -> None:
    """The proxy holds a bundle with another CA alone (it missed the staging): the dial to a
    server whose certificate does not verify re-reads the credentials once (``refresh``) and
    goes on with them; refreshes are rate-limited, and without a newer bundle it is a 502."""
    env.targets.add(pvc("disk"))
    stale = upstream_context(new_ca("older", NOW).cert_pem, env.pki.client)
    reads: list[int] = []

    def refresh() -> ssl.SSLContext | None:
        reads.append(1)
        return env.pki.upstream()

    relay = env.proxy.relay
    relay.tls, relay.refresh = stale, refresh
    assert (await post(env))[0] == 200
    assert reads == [1] and relay.tls is not stale
    relay.tls, relay.refresh = stale, lambda: None  # nothing newer to read
    relay._refreshed_at = 0.0
    status, body, _ = await post(env)
    assert status == 502 and "tls: unable to get local issuer certificate" in body
    relay.refresh = refresh
    assert (await post(env))[0] == 502 and reads == [1]  # asked again too soon: not re-read
