"""The client transfer library (``commands.upload.client``) against real loopback servers: a
refused token is replaced by a fresh one from the provider, a refusal carries the server's
own words, progress reports bytes and rate. The token peer is a tiny real aiohttp server that
plays the proxy's token check (the proxy itself is tested in test_upload_proxy.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from commands.upload.client import (
    ClientSettings,
    UploadRejected,
    UploadUnauthorized,
    upload_file,
)
from tests.component.conftest import ImageFactory
from tests.component.uploader_harness import (
    Pki,
    data_target,
    free_port,
    make_pki,
    running_server,
    server_env,
)

Serve = Callable[[str, Callable[[web.Request], Awaitable[web.StreamResponse]]], Awaitable[str]]


class TokenPeer:
    """Accepts only ``valid``; counts the body bytes of accepted POSTs."""

    def __init__(self, valid: str) -> None:
        self.valid = valid
        self.received = 0
        self.tokens: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.tokens.append(token)
        if token != self.valid:
            return web.Response(status=401, text="token expired")
        if request.method == "HEAD":
            return web.Response(status=200, headers={"Upload-Offset": "0"})
        async for piece in request.content.iter_chunked(1 << 20):
            self.received += len(piece)
        return web.Response(status=200)


async def test_a_refused_token_is_refreshed_and_the_upload_goes_on(
    tmp_path: Path, serve: Serve
) -> None:
    image = tmp_path / "disk.raw"
    image.write_bytes(b"\x01" * 3_000_000)
    peer = TokenPeer("fresh")
    url = await serve("127.0.0.1", peer.handle)
    issued = iter(["stale", "fresh"])
    seen: list[tuple[int, float]] = []

    result = await upload_file(
        str(image),
        ClientSettings(url, ssl=False, backoff_initial=0.01),
        token=lambda: next(issued),
        progress=lambda done, rate: seen.append((done, rate)),
    )
    assert peer.received == image.stat().st_size
    assert peer.tokens[0] == "stale" and peer.tokens[-1] == "fresh"
    assert result.size == image.stat().st_size
    assert seen[-1][0] == image.stat().st_size and all(rate >= 0 for _, rate in seen)


async def test_a_token_refused_after_every_refresh_is_unauthorized(
    tmp_path: Path, serve: Serve
) -> None:
    image = tmp_path / "disk.raw"
    image.write_bytes(b"\x01" * 1000)
    url = await serve("127.0.0.1", TokenPeer("never").handle)

    async def provider() -> str:
        return "stale"

    with pytest.raises(UploadUnauthorized, match=r"^401: the upload token was refused"):
        await upload_file(str(image), ClientSettings(url, ssl=False), token=provider)


async def test_a_refusal_carries_the_servers_message(tmp_path: Path, images: ImageFactory) -> None:
    pki: Pki = make_pki(tmp_path / "pki")
    env = server_env(pki, data_target(tmp_path), "4Mi", free_port())
    async with running_server(env) as srv:
        with pytest.raises(UploadRejected) as caught:
            await upload_file(str(images.make("qcow2").path), srv.settings(pki))
        assert not srv.task.done()
    assert caught.value.status == 400
    assert "effective image size is larger than the reported available" in caught.value.message
    await asyncio.sleep(0)
