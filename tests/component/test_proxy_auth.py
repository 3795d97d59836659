"""Imports through a proxy that demands credentials (``Proxy-Authorization: Basic``), the way
CDIConfig ``importProxy`` names one (``http(s)://user:password@host:port``): a real forward proxy
on loopback (``testkit.tlsproxy``), plain http or TLS with a private CA, in front of http and
https image servers. The right credentials reach the proxy on every request and tunnel; a wrong
password is a permanent ``ProxyAuthenticationFailed`` naming the proxy's 407, at once (no retry
loop), with no credential in the message and the image server never asked.

The same through the import proxy relay (``cdi.importproxy``), as the controller wires a
credentialed importProxy: the importer holds only a ticket, the relay dials the proxy (with TLS
for an ``https://`` one, trusted by the ``trustedCAProxy`` bundle) and adds the credentials."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi.importproxy.relay import ImportProxyRelay, Upstreams
from cdi.importproxy.serve import proxy_tls, upstream
from cdi.importproxy.ticket import issue
from importer.sources.http import ProxyConfig
from testkit.pki import CertificateAuthority
from testkit.registry import Tls
from testkit.tlsproxy import TlsForwardProxy
from tests.component.conftest import ImageFactory, same_content
from tests.component.helpers import import_url

CREDENTIALS = "al@ice:pw-SECRET"
USERINFO = "al%40ice:pw-SECRET"  # as it is written in a proxy URL


@pytest.fixture(params=["http", "https"])
def proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TlsForwardProxy]:
    tls = None
    if request.param == "https":
        tls = Tls.make(tmp_path / "proxy-tls", CertificateAuthority("private-proxy-ca"))
    server = TlsForwardProxy(tls, credentials=CREDENTIALS).start()
    yield server
    server.stop()


def _through(proxy: TlsForwardProxy, userinfo: str) -> dict[str, object]:
    url = proxy.url_with(userinfo)
    ca = () if proxy.tls is None else (str(proxy.tls.ca_pem),)
    return {"proxy": ProxyConfig(http=url, https=url), "proxy_ca_files": ca}


@pytest.mark.parametrize("destination", ["http", "https"])
async def test_the_proxy_credentials_reach_an_authenticating_proxy(
    destination: str,
    proxy: TlsForwardProxy,
    origins: dict[str, tuple[str, list[str]]],
    target_tls: Tls,
    images: ImageFactory,
    tmp_path: Path,
) -> None:
    image = images.make("qcow2")
    origin, seen = origins[destination]
    result = await import_url(
        f"{origin}/{image.path.name}",
        tmp_path / "disk.img",
        ca_files=(str(target_tls.ca_pem),),
        **_through(proxy, USERINFO),
    )
    assert result.reason == "Completed", result
    assert same_content(tmp_path / "disk.img", image.reference)
    assert f"GET /{image.path.name}" in seen
    expected = "Basic " + base64.b64encode(CREDENTIALS.encode()).decode()
    assert proxy.authorizations and set(proxy.authorizations) == {expected}
    assert proxy.refused == 0
    assert proxy.tunnels if destination == "https" else proxy.forwarded, "not through it"


@pytest.mark.parametrize("destination", ["http", "https"])
async def test_a_wrong_proxy_password_fails_at_once_naming_the_407_not_the_password(
    destination: str,
    proxy: TlsForwardProxy,
    origins: dict[str, tuple[str, list[str]]],
    target_tls: Tls,
    images: ImageFactory,
    tmp_path: Path,
) -> None:
    image = images.make("raw")
    origin, seen = origins[destination]
    result = await import_url(
        f"{origin}/{image.path.name}",
        tmp_path / "disk.img",
        ca_files=(str(target_tls.ca_pem),),
        **_through(proxy, "al%40ice:wrong-SECRET"),
    )
    assert result.reason == "ProxyAuthenticationFailed" and not result.transient, result
    assert "407" in result.message and f"127.0.0.1:{proxy.port}" in result.message
    assert "SECRET" not in result.message and "al%40ice" not in result.message
    # the HEAD hint and the GET, each refused once: no retry loop
    assert 1 <= proxy.refused <= 2, proxy.refused
    assert proxy.tunnels == [] and proxy.forwarded == [] and seen == []
    assert not (tmp_path / "disk.img").exists()


KEY = b"relay-key" * 4


async def _relay(proxy: TlsForwardProxy, userinfo: str, bundle: str) -> ImportProxyRelay:
    """The relay in front of ``proxy`` as ``cdi import-proxy`` reads CDIConfig: both
    importProxy URLs are ``proxy`` with ``userinfo``, its CA ``bundle`` (trustedCAProxy)."""
    target = upstream(proxy.url_with(userinfo), proxy_tls(bundle))
    assert target is not None and (target.tls is not None) == (proxy.tls is not None)

    async def upstreams() -> Upstreams:
        return Upstreams(http=target, https=target)

    return ImportProxyRelay(KEY, upstreams)


def _ticketed(port: int) -> ProxyConfig:
    url = f"http://{issue('vms', 'disk', time.time(), 600).userinfo(KEY)}@127.0.0.1:{port}"
    return ProxyConfig(http=url, https=url)


def _bundle(proxy: TlsForwardProxy) -> str:
    return "" if proxy.tls is None else proxy.tls.ca_pem.read_text()


@pytest.mark.parametrize("destination", ["http", "https"])
async def test_through_the_relay_the_proxy_gets_its_credentials_and_the_importer_a_ticket(
    destination: str,
    proxy: TlsForwardProxy,
    origins: dict[str, tuple[str, list[str]]],
    target_tls: Tls,
    images: ImageFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    relay = await _relay(proxy, USERINFO, _bundle(proxy))
    port = await relay.start("127.0.0.1", 0)
    try:
        image = images.make("qcow2")
        origin, seen = origins[destination]
        result = await import_url(
            f"{origin}/{image.path.name}",
            tmp_path / "disk.img",
            ca_files=(str(target_tls.ca_pem),),
            proxy=_ticketed(port),
        )
    finally:
        await relay.stop()
    assert result.reason == "Completed", result
    assert same_content(tmp_path / "disk.img", image.reference)
    assert f"GET /{image.path.name}" in seen
    expected = "Basic " + base64.b64encode(CREDENTIALS.encode()).decode()
    assert proxy.authorizations and set(proxy.authorizations) == {expected}
    assert proxy.tunnels if destination == "https" else proxy.forwarded, "not through it"
    # the password is in no log line of the relay or the importer, nor in the result
    for text in (caplog.text, result.to_json()):
        assert "pw-SECRET" not in text and expected.split()[1] not in text


async def test_through_the_relay_a_wrong_password_fails_at_once_naming_the_407(
    proxy: TlsForwardProxy,
    origins: dict[str, tuple[str, list[str]]],
    target_tls: Tls,
    images: ImageFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = await _relay(proxy, "al%40ice:wrong-SECRET", _bundle(proxy))
    port = await relay.start("127.0.0.1", 0)
    try:
        image = images.make("raw")
        origin, seen = origins["https"]
        result = await import_url(
            f"{origin}/{image.path.name}",
            tmp_path / "disk.img",
            ca_files=(str(target_tls.ca_pem),),
            proxy=_ticketed(port),
        )
    finally:
        await relay.stop()
    assert result.reason == "ProxyAuthenticationFailed" and not result.transient, result
    assert "SECRET" not in result.message and "vms~disk" not in result.message
    assert 1 <= proxy.refused <= 2 and seen == []
    assert "refused the credentials of CDIConfig importProxy (407)" in caplog.text
    assert "SECRET" not in caplog.text


async def test_the_relay_refuses_an_https_proxy_it_cannot_verify(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No trustedCAProxy bundle: the TLS handshake fails, the relay answers 502 and logs
    why; the proxy never reads a request (so never sees the credentials)."""
    tls = Tls.make(tmp_path / "proxy-tls", CertificateAuthority("private-proxy-ca"))
    proxy = TlsForwardProxy(tls, credentials=CREDENTIALS).start()
    relay = await _relay(proxy, USERINFO, "")
    port = await relay.start("127.0.0.1", 0)
    try:
        ticket = issue("vms", "disk", time.time(), 600).userinfo(KEY)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        auth = base64.b64encode(ticket.encode()).decode()
        head = f"CONNECT images.example:443 HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n"
        writer.write(head.encode() + b"\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await relay.stop()
        proxy.stop()
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert proxy.authorizations == [] and proxy.tunnels == [] and proxy.forwarded == []
    assert "trustedCAProxy" in caplog.text and "SECRET" not in caplog.text


async def test_a_finished_tunnel_through_an_https_proxy_frees_its_relay_slot_at_once(
    tmp_path: Path,
) -> None:
    """A CONNECT tunnel through the relay to an ``https://`` proxy carries bytes both ways;
    when the importer's side ends, the relay ends its TLS to the proxy (TLS has no half-close),
    so the tunnel's slot is free at once, not after the 300 s idle limit."""
    tls = Tls.make(tmp_path / "proxy-tls", CertificateAuthority("private-proxy-ca"))
    proxy = TlsForwardProxy(tls, credentials=CREDENTIALS).start()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    destination = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = destination.sockets[0].getsockname()[1]
    relay = await _relay(proxy, USERINFO, tls.ca_pem.read_text())
    assert relay.config.idle_timeout >= 300
    port = await relay.start("127.0.0.1", 0)
    try:
        ticket = issue("vms", "disk", time.time(), 600).userinfo(KEY)
        auth = base64.b64encode(ticket.encode()).decode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n"
        writer.write(head.encode() + b"\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(
            b"HTTP/1.1 200"
        )
        writer.write(b"hello")
        assert await asyncio.wait_for(reader.readexactly(5), 10) == b"HELLO"
        assert relay.active == 1
        writer.close()
        for _ in range(100):  # 5 s, not the idle limit
            if not relay.active:
                break
            await asyncio.sleep(0.05)
        assert relay.active == 0, "the finished tunnel still holds its slot"
    finally:
        await relay.stop()
        proxy.stop()
        destination.close()
    assert proxy.tunnels == [f"127.0.0.1:{target}"]


def test_an_https_proxy_url_is_dialled_with_tls_on_443_by_default() -> None:
    parsed = upstream("https://u:p@proxy.corp")
    assert parsed is not None and (parsed.host, parsed.port) == ("proxy.corp", 443)
    assert parsed.tls is not None and parsed.authorization == "Basic dTpw"
    assert "dTpw" not in repr(parsed)  # the credentials never reach a log line through repr
    plain = upstream("http://proxy.corp")
    assert plain is not None and plain.port == 80 and plain.tls is None
    assert upstream("socks5://proxy.corp") is None
