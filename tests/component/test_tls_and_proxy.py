"""HTTPS with a custom CA or insecureSkipVerify, and an HTTP proxy with NO_PROXY, on loopback."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from importer.sources.http import ProxyConfig
from tests.component.badserver import Recorder, make_app
from tests.component.conftest import ImageFactory, same_content
from tests.component.helpers import import_url


def _cert(
    subject: str,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
    issuer: x509.Name | None = None,
    *,
    ca: bool,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key or key, hashes.SHA256()), key


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path, Path]]:
    ca, ca_key = _cert("test-ca", ca=True)
    leaf, leaf_key = _cert("127.0.0.1", ca_key, ca.subject, ca=False)
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "tls.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "tls.key").write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    root = tmp_path / "served"
    root.mkdir()
    runner = web.AppRunner(make_app(root, Recorder()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"https://127.0.0.1:{port}", root, tmp_path / "ca.crt"
    await runner.cleanup()


async def test_https_needs_the_ca_or_insecure(
    images: ImageFactory, tls_server: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, root, ca = tls_server
    image = images.make("qcow2", "gz")
    (root / image.path.name).symlink_to(image.path)
    link = f"{url}/ok/{image.path.name}"
    untrusted = await import_url(link, tmp_path / "a.img")
    assert untrusted.reason == "SourceUnavailable" and not untrusted.transient
    assert "CA" in untrusted.message and not (tmp_path / "a.img").exists()
    trusted = await import_url(link, tmp_path / "b.img", ca_files=(str(ca),))
    assert trusted.succeeded, trusted
    assert same_content(tmp_path / "b.img", image.reference)
    insecure = await import_url(link, tmp_path / "c.img", insecure=True)
    assert insecure.succeeded, insecure


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """A forward proxy for plain HTTP: it streams whatever absolute URL it is asked for."""
    seen: list[str] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        seen.append(str(request.url))
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("range",)}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(request.method, str(request.url), headers=headers) as upstream,
        ):
            resp = web.StreamResponse(status=upstream.status)
            for key in ("Content-Length", "Content-Range", "Accept-Ranges", "ETag"):
                if key in upstream.headers:
                    resp.headers[key] = upstream.headers[key]
            await resp.prepare(request)
            async for chunk in upstream.content.iter_chunked(1 << 20):
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_http_proxy_is_used_and_no_proxy_bypasses_it(
    images: ImageFactory,
    server,
    proxy: tuple[str, list[str]],
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    proxy_url, seen = proxy
    image = images.make("raw", "zst")
    link = server.link("ok", image.path)
    via = await import_url(link, tmp_path / "a.img", proxy=ProxyConfig(http=proxy_url))
    assert via.succeeded, via
    assert same_content(tmp_path / "a.img", image.reference)
    assert any(image.path.name in url for url in seen)
    count = len(seen)
    direct = await import_url(
        link, tmp_path / "b.img", proxy=ProxyConfig(http=proxy_url, no_proxy=("127.0.0.1",))
    )
    assert direct.succeeded
    assert len(seen) == count  # bypassed


@pytest.fixture
async def connect_proxy() -> AsyncIterator[tuple[str, list[tuple[str, str | None]]]]:
    """A CONNECT proxy (what HTTPS goes through): it records each tunnel's target and
    Proxy-Authorization, then relays bytes both ways without seeing inside TLS."""
    tunnels: list[tuple[str, str | None]] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, _ = head[0].split(" ")
        auth = next(
            (
                line.split(":", 1)[1].strip()
                for line in head[1:]
                if line.lower().startswith("proxy-authorization:")
            ),
            None,
        )
        tunnels.append((target, auth))
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        host, port = target.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://bob:pr0xy@127.0.0.1:{port}", tunnels
    server.close()


async def test_https_goes_through_a_connect_tunnel_with_proxy_credentials(
    images: ImageFactory,
    tls_server: tuple[str, Path, Path],
    connect_proxy: tuple[str, list[tuple[str, str | None]]],
    tmp_path: Path,
) -> None:
    url, root, ca = tls_server
    proxy_url, tunnels = connect_proxy
    image = images.make("raw", "xz")
    (root / image.path.name).symlink_to(image.path)
    link = f"{url}/ok/{image.path.name}"
    result = await import_url(
        link, tmp_path / "disk.img", ca_files=(str(ca),), proxy=ProxyConfig(https=proxy_url)
    )
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)
    assert tunnels, "the import did not use the proxy"
    assert all(target == url.removeprefix("https://") for target, _ in tunnels)
    assert all(auth == aiohttp.encode_basic_auth("bob", "pr0xy") for _, auth in tunnels)


async def test_https_redirect_to_http_is_refused_as_a_downgrade(
    images: ImageFactory, tls_server: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, root, ca = tls_server
    image = images.make("raw")
    (root / image.path.name).symlink_to(image.path)
    link = f"{url}/downgrade/{image.path.name}"
    result = await import_url(link, tmp_path / "disk.img", ca_files=(str(ca),))
    assert result.reason == "SourceForbidden" and not result.transient, result
    assert "downgrade" in result.message and not (tmp_path / "disk.img").exists()


async def test_certificate_is_checked_against_the_host_name_not_the_dialled_address(
    images: ImageFactory, tls_server: tuple[str, Path, Path], tmp_path: Path
) -> None:
    """The client dials the checked address itself; TLS must still verify the name in the
    URL: ``localhost`` resolves to 127.0.0.1, whose certificate does not name ``localhost``."""
    url, root, ca = tls_server
    image = images.make("raw")
    (root / image.path.name).symlink_to(image.path)
    port = url.rsplit(":", 1)[1]
    link = f"https://localhost:{port}/ok/{image.path.name}"
    result = await import_url(link, tmp_path / "disk.img", ca_files=(str(ca),))
    assert result.reason == "SourceUnavailable" and not result.transient, result
    assert "localhost" in result.message and "match" in result.message
