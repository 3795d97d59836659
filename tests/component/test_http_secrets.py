"""Secrets stay where they belong, on loopback: secret headers and URL credentials only to the
named origin, never in a request line or ``Host``; URLs redacted in every failure message; the
policy's default refuses loopback before any connection; bad redirects are typed errors."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import encode_basic_auth, web

from cdi.api.errors import SourceForbidden
from cdi.api.netpolicy import NetPolicy
from datapath import Processor, TargetSpec
from importer.config import HttpOptions, build_plan, from_env
from importer.runner import run_import
from importer.sources.http import HttpSource, ProxyConfig
from importer.sources.http_client import Dialer
from tests.component.conftest import Handler, ImageFactory, Server, same_content
from tests.component.helpers import import_url

Serve = Callable[[str, Handler], Awaitable[str]]
SECRET_URL = "http://alice:pw-SECRET@{host}/{path}?token=tok-SECRET&x=1"


async def test_the_default_policy_refuses_loopback_before_connecting(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as canary:
        canary.setblocking(False)
        port = canary.getsockname()[1]
        result = await import_url(
            f"http://127.0.0.1:{port}/disk.img", tmp_path / "disk.img", policy=NetPolicy()
        )
        assert result.reason == "SourceForbidden" and not result.transient, result
        with pytest.raises(BlockingIOError):
            canary.accept()  # nothing ever connected
    assert not (tmp_path / "disk.img").exists()


async def test_secret_headers_and_url_credentials_go_only_to_the_named_origin(
    serve: Serve, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("raw", "gz")
    seen: dict[str, list[dict[str, str]]] = {"named": [], "other": []}

    def record(side: str, request: web.Request) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        seen[side].append({**headers, "target": request.raw_path})

    async def other(request: web.Request) -> web.StreamResponse:
        record("other", request)
        return web.FileResponse(image.path)

    other_url = await serve("127.0.0.2", other)

    async def named(request: web.Request) -> web.StreamResponse:
        record("named", request)
        raise web.HTTPFound(f"{other_url}/{image.path.name}")

    named_url = await serve("127.0.0.1", named)
    url = SECRET_URL.format(host=named_url.removeprefix("http://"), path=image.path.name)
    result = await import_url(
        url,
        tmp_path / "disk.img",
        headers=(("X-Plain", "p"),),
        secret_headers=(("X-Secret", "s-SECRET"),),
    )
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)
    expected = encode_basic_auth("alice", "pw-SECRET")
    assert seen["named"] and all(
        h["authorization"] == expected and h["x-secret"] == "s-SECRET" and h["x-plain"] == "p"
        for h in seen["named"]
    )
    assert seen["other"] and all(
        "authorization" not in h and "x-secret" not in h and h["x-plain"] == "p"
        for h in seen["other"]
    )
    for h in seen["named"] + seen["other"]:
        assert "pw-SECRET" not in h["target"] and "@" not in h["host"]


async def test_a_request_signer_signs_only_requests_to_the_named_origin(
    serve: Serve, images: ImageFactory, tmp_path: Path
) -> None:
    """The S3 source's per-request signer (``Client.signer``) is a credential like basic auth:
    a redirect to another origin gets no signature, and each request to the named one is
    signed for its own method and URL."""
    image = images.make("raw", "gz")
    seen: dict[str, list[str]] = {"named": [], "other": []}

    async def other(request: web.Request) -> web.StreamResponse:
        seen["other"].append(request.headers.get("Authorization", ""))
        return web.FileResponse(image.path)

    other_url = await serve("127.0.0.2", other)

    async def named(request: web.Request) -> web.StreamResponse:
        seen["named"].append(request.headers.get("Authorization", ""))
        raise web.HTTPFound(f"{other_url}/{image.path.name}")

    named_url = await serve("127.0.0.1", named)
    signed: list[tuple[str, str]] = []

    def signer(method: str, url: str) -> dict[str, str]:
        signed.append((method, url))
        return {"Authorization": f"Sig {method} {url}"}

    options = HttpOptions(f"{named_url}/start", policy=NetPolicy.parse(["127.0.0.0/8"]))
    source = HttpSource(options, signer=signer)
    plan = build_plan(options, TargetSpec(path=str(tmp_path / "disk.img"), block=False))
    result = await Processor(plan, source).run()
    assert result.succeeded, result
    assert seen["named"] and all(a.startswith("Sig ") for a in seen["named"])
    assert seen["other"] and not any(seen["other"])
    assert signed and all(url == f"{named_url}/start" for _, url in signed)


async def test_userinfo_never_reaches_a_proxy_request_line_or_host(
    serve: Serve, tmp_path: Path
) -> None:
    requests: list[tuple[str, str]] = []

    async def proxy(request: web.Request) -> web.StreamResponse:
        requests.append((request.raw_path, request.headers.get("Host", "")))
        raise web.HTTPNotFound()

    proxy_url = await serve("127.0.0.1", proxy)
    url = SECRET_URL.format(host="127.0.0.2:9", path="disk.img")
    result = await import_url(url, tmp_path / "disk.img", proxy=ProxyConfig(http=proxy_url))
    assert result.reason == "SourceNotFound", result
    assert requests and all(
        target == "http://127.0.0.2:9/disk.img?token=tok-SECRET&x=1" and host == "127.0.0.2:9"
        for target, host in requests
    )
    assert "SECRET" not in result.message and "REDACTED" in result.message


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("ok", "SourceNotFound"),  # the file is not there: 404
        ("alwaysdown", "SourceUnavailable"),  # 502 after retries
        ("auth", "SourceForbidden"),  # 401
        ("alwayscut", "SourceUnavailable"),  # resumes exhausted
        ("badlocation", "SourceUnavailable"),
    ],
)
async def test_failure_messages_never_show_userinfo_or_query(
    server: Server, images: ImageFactory, tmp_path: Path, mode: str, reason: str
) -> None:
    image = images.make("raw")
    name = "missing.img" if mode == "ok" else image.path.name
    if mode != "ok":
        server.link(mode, image.path)
    url = SECRET_URL.format(host=server.url.removeprefix("http://"), path=f"{mode}/{name}")
    result = await import_url(url, tmp_path / "disk.img", attempts=2, resumes=2)
    assert result.reason == reason, result
    assert "SECRET" not in result.message and "REDACTED" in result.message, result.message


async def test_unreachable_and_refused_urls_are_redacted_too(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    unreachable = await import_url(
        SECRET_URL.format(host=f"127.0.0.1:{port}", path="d"), tmp_path / "a.img", attempts=1
    )
    assert unreachable.reason == "SourceUnavailable", unreachable
    refused = await import_url(
        SECRET_URL.format(host="127.0.0.1:9", path="d"), tmp_path / "b.img", policy=NetPolicy()
    )
    assert refused.reason == "SourceForbidden", refused
    for result in (unreachable, refused):
        assert "SECRET" not in result.message, result.message


async def test_non_ascii_redirect_location_is_a_typed_error(
    server: Server, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("raw")
    result = await import_url(server.link("badlocation", image.path), tmp_path / "disk.img")
    assert result.reason == "SourceUnavailable" and not result.transient, result
    assert "not printable ASCII" in result.message
    assert not (tmp_path / "disk.img").exists()


async def test_pod_proxy_credentials_come_from_the_mounted_secret(
    serve: Serve, tmp_path: Path
) -> None:
    """The pod env names the proxy without credentials; the mounted Secret adds them, and
    they reach the proxy as Proxy-Authorization, never the origin."""
    seen: list[tuple[str | None, str | None]] = []

    async def proxy(request: web.Request) -> web.StreamResponse:
        seen.append((request.headers.get("Proxy-Authorization"), request.headers.get("Host")))
        raise web.HTTPNotFound()

    proxy_url = await serve("127.0.0.1", proxy)
    auth = tmp_path / "proxy-auth"
    auth.mkdir()
    (auth / "http").write_text("al%40ice:pw-SECRET\n")
    (tmp_path / "data").mkdir()
    env = {
        "IMPORTER_ENDPOINT": "http://127.0.0.2:9/disk.img",
        "IMPORTER_DATA_DIR": str(tmp_path / "data"),
        "IMPORTER_ALLOWED_SOURCE_CIDRS": "127.0.0.0/8",
        "IMPORTER_PROXY_AUTH_DIR": str(auth),
        "http_proxy": proxy_url,
        "IMPORTER_TERMINATION_PATH": str(tmp_path / "term"),
    }
    config = from_env(env)
    config = replace(config, edges=replace(config.edges, metrics_port=None))
    assert isinstance(config.source, HttpOptions)
    result = await run_import(replace(config, source=replace(config.source, attempts=1)))
    assert result.reason == "SourceNotFound", result
    assert seen and all(
        auth == encode_basic_auth("al@ice", "pw-SECRET") and host == "127.0.0.2:9"
        for auth, host in seen
    )
    assert "SECRET" not in result.message


async def test_through_a_proxy_refused_literals_never_reach_it_and_names_are_its_business(
    serve: Serve, tmp_path: Path
) -> None:
    """The proxy (on loopback, recording, forwarding nothing) is trusted; a destination that is
    a refused address literal, in any spelling, is refused before it is asked, while a name is
    resolved by the proxy, so it is passed on (documented)."""
    asked: list[str] = []

    async def proxy(request: web.Request) -> web.StreamResponse:
        asked.append(request.raw_path)
        raise web.HTTPNotFound()

    proxied = ProxyConfig(http=await serve("127.0.0.1", proxy))
    for i, url in enumerate(
        ["http://169.254.169.254/latest", "http://0xa9fea9fe/", "http://[fd00:ec2::254]/"]
    ):
        result = await import_url(url, tmp_path / f"{i}.img", proxy=proxied)
        assert result.reason == "SourceForbidden", result
    assert not asked
    named = await import_url("http://image.example/d.img", tmp_path / "n.img", proxy=proxied)
    assert named.reason == "SourceNotFound" and set(asked) == {"http://image.example/d.img"}


def test_a_name_resolving_to_any_refused_address_is_refused_whole() -> None:
    """The resolver is injected: the name resolves to the canary on loopback first, then to a
    metadata address. Connecting to the allowed one alone would still be wrong (the next
    connection could pick the other), so the name is refused and the canary sees nothing."""
    with socket.create_server(("127.0.0.1", 0)) as canary:
        canary.setblocking(False)
        port = canary.getsockname()[1]
        dialer = Dialer(
            NetPolicy.parse(["127.0.0.0/8"]),
            resolve=lambda host, port: ["127.0.0.1", "169.254.169.254"],
        )
        with pytest.raises(SourceForbidden, match="metadata or link-local"):
            dialer.connect("mixed.example", port, 1.0, "http://mixed.example")
        with pytest.raises(BlockingIOError):
            canary.accept()
        allowed = Dialer(NetPolicy.parse(["127.0.0.0/8"]), resolve=lambda h, p: ["127.0.0.1"])
        allowed.connect("loop.example", port, 1.0, "http://loop.example").close()
        assert canary.accept()  # the same dial to an allowed name does connect
