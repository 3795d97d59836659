"""``cdi upload``'s transfer rules against a real HTTP server on 127.0.0.1: a 401 on the first
request fails at once with ``authentication failed``; a later 401 gets a fresh token, at most
three times; progress reaches the file size; a proxy that is not there is a typed error."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from cdi.pki.certs import new_ca
from commands.upload.client import UploadRejected
from commands.upload.transfer import AuthenticationFailed, ClientTransfer, ProxyUnreachable


@dataclass
class Proxy:
    """Accepts the tokens in ``valid``; ``expire_on_post``: the first token expires when the
    first POST arrives (a token that aged between detection and upload)."""

    valid: set[str] = field(default_factory=lambda: {"t0"})
    refuse_all_posts: bool = False
    expire_on_post: bool = False
    received: bytearray = field(default_factory=bytearray)
    auths: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.auths.append(f"{request.method} {token}")
        if request.method == "POST" and self.expire_on_post:
            self.valid.discard("t0")
        if token not in self.valid or (request.method == "POST" and self.refuse_all_posts):
            return web.Response(status=401, text="token expired")
        if request.method == "HEAD":
            return web.Response(status=200, headers={"Upload-Offset": str(len(self.received))})
        async for piece in request.content.iter_chunked(65536):
            self.received += piece
        return web.Response(status=200)


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[Proxy, str]]:
    state = Proxy()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield state, f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "disk.raw"
    path.write_bytes(bytes(range(256)) * 12_000)
    return path


class Tokens:
    def __init__(self, proxy: Proxy) -> None:
        self.proxy, self.made = proxy, 0

    def refresh(self) -> str:
        self.made += 1
        token = f"t{self.made}"
        self.proxy.valid = {token}  # the older ones expired
        return token


async def test_a_401_on_the_first_request_fails_at_once(
    proxy: tuple[Proxy, str], image: Path
) -> None:
    state, url = proxy
    tokens = Tokens(state)
    with pytest.raises(AuthenticationFailed) as err:
        await ClientTransfer()(url, image, lambda: "forged", tokens.refresh, lambda d, t: None)
    assert err.value.message.startswith("authentication failed: ")
    assert tokens.made == 0 and state.received == b""


async def test_a_later_401_gets_a_fresh_token_and_the_upload_completes(
    proxy: tuple[Proxy, str], image: Path
) -> None:
    state, url = proxy
    state.expire_on_post = True  # t0 passes the probe and the detection, then ages out
    tokens = Tokens(state)
    seen: list[tuple[int, int]] = []
    await ClientTransfer()(
        url, image, lambda: "t0", tokens.refresh, lambda d, t: seen.append((d, t))
    )
    assert tokens.made == 1
    assert state.auths[:3] == ["HEAD t0", "HEAD t0", "POST t0"]
    assert "POST t1" in state.auths
    assert bytes(state.received) == image.read_bytes()
    size = image.stat().st_size
    assert seen[-1] == (size, size)


async def test_tokens_are_refreshed_at_most_three_times(
    proxy: tuple[Proxy, str], image: Path
) -> None:
    state, url = proxy
    tokens = Tokens(state)
    state.refuse_all_posts = True
    with pytest.raises(UploadRejected) as err:
        await ClientTransfer()(url, image, lambda: "t0", tokens.refresh, lambda d, t: None)
    assert err.value.status == 401 and tokens.made == 3


async def test_a_proxy_that_is_not_there_is_a_typed_error(image: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ProxyUnreachable) as err:
        await ClientTransfer()(
            f"https://127.0.0.1:{port}", image, lambda: "t", lambda: "t", lambda d, t: None
        )
    assert err.value.message.startswith(f"cannot reach the upload proxy https://127.0.0.1:{port}")


def test_insecure_skips_verification_and_a_ca_is_trusted() -> None:
    assert ClientTransfer(insecure=True).ssl_context() is False
    assert ClientTransfer().ssl_context() is True
    ca = new_ca("cdi-uploadproxy-ca", dt.datetime.now(dt.UTC)).cert_pem.decode()
    context = ClientTransfer(ca_pem=ca).ssl_context()
    assert isinstance(context, ssl.SSLContext)
    assert any(
        dict(x[0] for x in c["subject"]).get("commonName") == "cdi-uploadproxy-ca"
        for c in context.get_ca_certs()
    )
