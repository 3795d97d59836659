"""The import proxy relay in front of an ``https://`` proxy with credentials (issue 27; CDIConfig
``importProxy.HTTPSProxy: https://user:password@proxy``, which CDI supports): the relay's leg to
the proxy is TLS verified with ``trustedCAProxy``'s bundle, it adds the password, and the
importer, holding only a ticket, imports through it. A real TLS forward proxy demanding the
credentials, a real image server, the real importer; nothing of the password in the logs."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from cdi.importproxy.relay import ImportProxyRelay, RelayConfig, Upstreams
from cdi.importproxy.serve import upstream
from cdi.importproxy.ticket import issue
from importer.sources.http import ProxyConfig
from testkit.pki import CertificateAuthority
from testkit.registry import Tls
from testkit.tlsproxy import TlsForwardProxy
from tests.component.conftest import ImageFactory, Server, same_content
from tests.component.helpers import import_url

KEY = b"k" * 32
USER, PASSWORD = "al@ice", "pw-SECRET-9f1c"
PROXY_URL = "https://al%40ice:pw-SECRET-9f1c@127.0.0.1:{port}"


@pytest.fixture
def proxy_tls(tmp_path: Path) -> Tls:
    return Tls.make(tmp_path / "proxy-tls", CertificateAuthority("private-proxy-ca"))


@pytest.fixture
def proxy(proxy_tls: Tls) -> Iterator[TlsForwardProxy]:
    server = TlsForwardProxy(proxy_tls, credentials=f"{USER}:{PASSWORD}").start()
    try:
        yield server
    finally:
        server.stop()


async def _relay(up: Upstreams) -> tuple[ImportProxyRelay, int]:
    async def upstreams() -> Upstreams:
        return up

    relay = ImportProxyRelay(KEY, upstreams, RelayConfig(head_timeout=2.0))
    return relay, await relay.start("127.0.0.1", 0)


@pytest.fixture
async def relay_port(proxy: TlsForwardProxy, proxy_tls: Tls) -> AsyncIterator[int]:
    target = upstream(PROXY_URL.format(port=proxy.port), proxy_tls.ca_pem.read_text())
    assert target is not None and target.tls is not None
    relay, port = await _relay(Upstreams(http=target, https=target))
    yield port
    await relay.stop()


def _userinfo() -> str:
    return issue("vms", "disk", time.time(), 60.0).userinfo(KEY)


def _ticket_proxy(port: int) -> ProxyConfig:
    user, _, password = _userinfo().partition(":")
    url = f"http://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{port}"
    return ProxyConfig(http=url, https=url)


async def test_an_import_goes_through_the_relay_to_an_https_proxy_with_its_password(
    relay_port: int,
    proxy: TlsForwardProxy,
    images: ImageFactory,
    server: Server,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    image = images.make("qcow2")
    url = server.link("ok", image.path)
    target = tmp_path / "disk.img"
    result = await import_url(url, target, proxy=_ticket_proxy(relay_port))
    assert result.succeeded, result
    assert same_content(target, image.reference)
    assert any(f.startswith("GET http://127.0.0.1:") for f in proxy.forwarded), proxy.forwarded
    assert proxy.refused == 0  # the relay's Basic credentials were the proxy's
    secret = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert PASSWORD not in caplog.text and secret not in caplog.text
    assert PASSWORD not in result.to_json()


async def test_a_connect_tunnel_reaches_its_destination_through_the_https_proxy(
    relay_port: int, proxy: TlsForwardProxy
) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.readexactly(5)).upper())
        await writer.drain()
        writer.close()

    destination = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = destination.sockets[0].getsockname()[1]
    auth = base64.b64encode(_userinfo().encode()).decode()
    reader, writer = await asyncio.open_connection("127.0.0.1", relay_port)
    writer.write(
        f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"HELLO"
    writer.close()
    destination.close()
    assert proxy.tunnels == [f"127.0.0.1:{port}"]


async def test_without_the_proxys_ca_the_relay_refuses_and_the_proxy_sees_nothing(
    proxy: TlsForwardProxy, caplog: pytest.LogCaptureFixture
) -> None:
    untrusted = upstream(PROXY_URL.format(port=proxy.port))  # no trustedCAProxy bundle
    assert untrusted is not None
    relay, port = await _relay(Upstreams(http=untrusted, https=untrusted))
    try:
        auth = base64.b64encode(_userinfo().encode()).decode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET http://127.0.0.1:9/x HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
            + f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 502 Bad Gateway")
        writer.close()
    finally:
        await relay.stop()
    assert not proxy.forwarded and not proxy.tunnels
    assert "trustedCAProxy" in caplog.text and PASSWORD not in caplog.text


def test_an_https_proxy_url_is_dialled_with_tls_on_443_by_default() -> None:
    parsed = upstream("https://u:p@proxy.corp")
    assert parsed is not None and (parsed.host, parsed.port) == ("proxy.corp", 443)
    assert parsed.tls is not None and parsed.authorization == "Basic dTpw"
    assert "dTpw" not in repr(parsed)  # the credentials never reach a log line through repr
    plain = upstream("http://proxy.corp")
    assert plain is not None and plain.port == 80 and plain.tls is None
    assert upstream("socks5://proxy.corp") is None
