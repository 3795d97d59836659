"""The import proxy relay (S4) between a client and a real upstream proxy on loopback: a valid
ticket is replaced by the upstream's credentials (plain requests and CONNECT tunnels), and
anything else is refused before the upstream sees a byte."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from cdi.importproxy.relay import ImportProxyRelay, RelayConfig, Upstream, Upstreams
from cdi.importproxy.ticket import TicketRefused, check, issue

KEY = b"k" * 32
REAL = "Basic " + base64.b64encode(b"al@ice:pw-SECRET").decode()
NOW = 1_000_000.0


@dataclass
class FakeProxy:
    """An upstream forward proxy: answers plain requests itself, tunnels CONNECT to an echo."""

    heads: list[bytes] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        if head.startswith(b"CONNECT "):
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            while data := await reader.read(65536):
                writer.write(data.upper())
                await writer.drain()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nvia-upstream")
            await writer.drain()
        writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[FakeProxy]:
    proxy = FakeProxy()
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    yield proxy
    server.close()


@pytest.fixture
async def relay(upstream: FakeProxy) -> AsyncIterator[int]:
    target = Upstream("127.0.0.1", upstream.port, REAL)

    async def upstreams() -> Upstreams:
        return Upstreams(http=target, https=target)

    config = RelayConfig(head_timeout=1.0, max_head=4096)
    server = ImportProxyRelay(KEY, upstreams, config, clock=lambda: NOW)
    port = await server.start("127.0.0.1", 0)
    yield port
    await server.stop()


def _auth(userinfo: str) -> bytes:
    return b"Proxy-Authorization: Basic " + base64.b64encode(userinfo.encode()) + b"\r\n"


def _ticket(ns: str = "vms", lifetime: float = 60.0, key: bytes = KEY) -> str:
    return issue(ns, "disk", NOW, lifetime).userinfo(key)


async def _exchange(port: int, data: bytes, then: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    if then:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(then)
        writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_a_plain_request_reaches_the_upstream_with_its_credentials_not_the_ticket(
    relay: int, upstream: FakeProxy
) -> None:
    ticket = _ticket()
    head = b"GET http://images.example/disk.img HTTP/1.1\r\nHost: images.example\r\n"
    answer = await _exchange(relay, head + _auth(ticket) + b"Connection: keep-alive\r\n\r\n")
    assert answer.endswith(b"via-upstream")
    (seen,) = upstream.heads
    assert f"Proxy-Authorization: {REAL}\r\n".encode() in seen
    assert ticket.encode() not in seen and base64.b64encode(ticket.encode()) not in seen
    assert b"Connection: close\r\n" in seen and b"keep-alive" not in seen


async def test_a_connect_tunnel_carries_bytes_both_ways_with_the_upstream_credentials(
    relay: int, upstream: FakeProxy
) -> None:
    head = b"CONNECT images.example:443 HTTP/1.1\r\nHost: images.example:443\r\n"
    answer = await _exchange(relay, head + _auth(_ticket()) + b"\r\n", then=b"tls bytes")
    assert answer == b"TLS BYTES"
    assert f"Proxy-Authorization: {REAL}\r\n".encode() in upstream.heads[0]


@pytest.mark.parametrize(
    "auth",
    [
        b"",
        _auth("vms~disk~1000060:forged"),
        _auth(_ticket(lifetime=-1)),  # expired
        _auth(_ticket(key=b"other" * 8)),  # not the controller's key
        _auth(_ticket().replace("vms~", "kube-system~", 1)),  # another namespace's name
        _auth("al@ice:pw-SECRET"),
        b"Proxy-Authorization: Bearer abc\r\n",
        b"Proxy-Authorization: Basic !!!\r\n",
    ],
)
async def test_anything_but_a_valid_ticket_is_refused_before_the_upstream(
    relay: int, upstream: FakeProxy, auth: bytes
) -> None:
    head = b"GET http://images.example/disk.img HTTP/1.1\r\nHost: images.example\r\n"
    answer = await _exchange(relay, head + auth + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 407 ")
    assert b'Proxy-Authenticate: Basic realm="cdi-import-proxy"' in answer
    assert upstream.heads == []


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"POST http://images.example/x HTTP/1.1", b"405"),
        (b"GET /disk.img HTTP/1.1", b"400"),
        (b"GET http://images.example/x\x00 HTTP/1.1", b"400"),
    ],
)
async def test_other_methods_and_malformed_requests_are_refused(
    relay: int, upstream: FakeProxy, request_line: bytes, status: bytes
) -> None:
    answer = await _exchange(relay, request_line + b"\r\n" + _auth(_ticket()) + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert upstream.heads == []


async def test_a_trickled_or_oversized_head_holds_no_slot(relay: int, upstream: FakeProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", relay)
    writer.write(b"GET http://images.example/ HTTP/1.1\r\n")
    assert await asyncio.wait_for(reader.read(), 3) == b""  # closed at the 1 s head deadline
    writer.close()
    big = b"GET http://x/ HTTP/1.1\r\nX-Pad: " + b"a" * 8192 + b"\r\n\r\n"
    assert (await _exchange(relay, big)).startswith(b"HTTP/1.1 431 ")
    assert upstream.heads == []


def test_a_ticket_names_its_import_and_expires() -> None:
    ticket = issue("vms", "disk", NOW, 60)
    user, _, password = ticket.userinfo(KEY).partition(":")
    assert check(user, password, KEY, NOW + 59) == ticket
    with pytest.raises(TicketRefused, match="expired"):
        check(user, password, KEY, NOW + 60)
    with pytest.raises(TicketRefused, match="not issued"):
        check(user.replace("vms", "vmz"), password, KEY, NOW)
    with pytest.raises(ValueError):
        issue("vms~x", "disk", NOW, 60)


async def test_one_address_cannot_hold_every_slot(upstream: FakeProxy) -> None:
    """Connections held open (no head yet) from one pod address take at most its share; a
    client at another address is still served."""
    target = Upstream("127.0.0.1", upstream.port, REAL)

    async def upstreams() -> Upstreams:
        return Upstreams(http=target, https=target)

    config = RelayConfig(head_timeout=30.0, max_connections=8, max_connections_per_address=2)
    server = ImportProxyRelay(KEY, upstreams, config, clock=lambda: NOW)
    port = await server.start("127.0.0.1", 0)
    held = [
        await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        for _ in range(8)
    ]
    try:
        await asyncio.sleep(0.2)
        assert server.active == 2  # the other six were closed at once
        request = "GET http://images.example/disk HTTP/1.1\r\nHost: images.example\r\n"
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=("127.0.0.3", 0)
        )
        writer.write(request.encode() + _auth(_ticket()) + b"\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 "), answer
    finally:
        for _, w in held:
            w.close()
        await server.stop()
