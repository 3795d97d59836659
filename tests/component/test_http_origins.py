"""Where requests go: credentials only to the origin the user named, redirects within and
across origins, on loopback (127.0.0.1 and 127.0.0.2 are different origins)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import encode_basic_auth, web

from tests.component.conftest import Handler, ImageFactory, same_content
from tests.component.helpers import import_url


async def test_credentials_go_only_to_the_named_origin(
    serve: Callable[[str, Handler], Awaitable[str]], images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("raw", "gz")
    seen: dict[str, list[str | None]] = {"named": [], "other": []}
    expected = encode_basic_auth("alice", "s3cret")

    async def other(request: web.Request) -> web.StreamResponse:
        seen["other"].append(request.headers.get("Authorization"))
        return web.FileResponse(image.path)

    other_url = await serve("127.0.0.2", other)

    async def named(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization")
        seen["named"].append(auth)
        if auth != expected:
            raise web.HTTPUnauthorized()
        if request.path.startswith("/start/"):  # same origin: credentials must follow
            raise web.HTTPFound(request.path.replace("/start/", "/protected/"))
        raise web.HTTPFound(f"{other_url}/{image.path.name}")  # another origin

    named_url = await serve("127.0.0.1", named)
    result = await import_url(
        f"{named_url}/start/{image.path.name}",
        tmp_path / "disk.img",
        username="alice",
        password="s3cret",
    )
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)
    assert seen["named"] and all(auth == expected for auth in seen["named"])
    assert seen["other"] and all(auth is None for auth in seen["other"])


async def test_redirect_loop_fails_with_a_reason_and_writes_nothing(
    serve: Callable[[str, Handler], Awaitable[str]], tmp_path: Path
) -> None:
    async def loop(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(request.path)

    url = await serve("127.0.0.1", loop)
    result = await import_url(f"{url}/disk.img", tmp_path / "disk.img", attempts=1)
    assert result.reason == "SourceUnavailable", result
    assert "redirects more than" in result.message
    assert not (tmp_path / "disk.img").exists()
