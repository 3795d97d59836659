"""The import proxy relay: an HTTP forward proxy in the ``cdi`` namespace that importers use
with a per-import ticket, and that speaks to the operator's ``importProxy`` with its password.

Why a relay (S4, ``docs/security.md``): the importer runs in the tenant's namespace, and
whatever reaches a pod there (a Secret, an env value, a file, the process's memory) reaches a
tenant with ``edit``, who may read Secrets and exec into pods. So the password stays here; the
importer's proxy userinfo is a ticket (``cdi.importproxy.ticket``) worth only GET, HEAD and
CONNECT through the proxy until it expires.

One request per connection, as an HTTP/1.1 forward proxy sees it from the importer
(``importer/sources/http_client.py``): ``GET``/``HEAD`` of an absolute ``http://`` URL (the
importer's ``http_proxy``), or ``CONNECT host:port`` for https (its ``https_proxy``). The relay
reads the head (bounded in size and in total time), checks the ticket in
``Proxy-Authorization``, and sends the same head to the upstream proxy with the ticket replaced
by the upstream's credentials (and ``Connection: close`` for a plain request, so a second
request on the connection never reaches the upstream un-rewritten); then it copies bytes both
ways until either side closes or both are idle for ``idle_timeout``. Of a response it reads
only the status line, to log an upstream's 407 for the operator (the importer reports it as
``ProxyAuthenticationFailed``); it never sees TLS inside a CONNECT tunnel. Refusals are short
plain answers (400, 405, 407, 431, 502, 503) that echo nothing of the request.

An upstream may listen with TLS (``importProxy`` ``https://user:password@proxy:port``): the
relay then speaks TLS to it (``Upstream.tls``, verified with the system's CAs and the bundle
of ``importProxy.trustedCAProxy``), and a CONNECT tunnel runs inside that TLS, the importer's
own TLS to the destination inside the tunnel. Importer to relay stays plain HTTP inside the
cluster, as for an ``http://`` upstream: an https destination is TLS end to end anyway.

The upstream settings come from a callable (the process reads CDIConfig, ``serve.py``); the
server itself touches no cluster API, so component tests run it against loopback proxies.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cdi.importproxy.ticket import Ticket, TicketRefused, check
from wire.connlimit import AddressSlots

log = logging.getLogger(__name__)

METHODS = frozenset({"GET", "HEAD", "CONNECT"})
# headers the relay owns: never passed on from the importer
_DROPPED = frozenset({"proxy-authorization", "proxy-connection", "connection", "keep-alive"})
_PIECE = 256 * 1024


@dataclass(frozen=True)
class Upstream:
    """The operator's proxy: address, the ``Proxy-Authorization`` value it wants, and for an
    ``https://`` proxy the TLS context its certificate is verified with (the system's CAs plus
    CDIConfig ``importProxy.trustedCAProxy``, ``serve.py``)."""

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)  # never in a log line
    tls: ssl.SSLContext | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Upstreams:
    http: Upstream | None = None  # plain requests (the importer's http_proxy)
    https: Upstream | None = None  # CONNECT (its https_proxy)


@dataclass(frozen=True)
class RelayConfig:
    head_timeout: float = 10.0  # the whole request head, however it trickles in
    max_head: int = 16 * 1024
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0  # nothing moved either way
    max_connections: int = 256
    # one importer pod address holds at most this many (0: no cap): a pod that opens
    # connections and sends nothing cannot take the slots of every other import
    max_connections_per_address: int = 16


class Refusal(Exception):
    def __init__(self, status: int, text: str, extra: str = "") -> None:
        super().__init__(text)
        self.status, self.text, self.extra = status, text, extra

    def answer(self) -> bytes:
        body = self.text.encode() + b"\n"
        head = (
            f"HTTP/1.1 {self.status} {self.text}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{self.extra}\r\n"
        )
        return head.encode() + body


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name]


def parse_head(head: bytes) -> Request:
    """A request head (ending in an empty line); ``Refusal`` 400 for anything malformed."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise Refusal(400, "Bad Request") from None
    lines = text[: -len("\r\n\r\n")].split("\r\n")
    if any(c in line for line in lines for c in "\r\n\0"):
        raise Refusal(400, "Bad Request")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refusal(400, "Bad Request")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise Refusal(400, "Bad Request")
        headers.append((name, value.strip()))
    return Request(parts[0], parts[1], parts[2], tuple(headers))


def ticket_of(request: Request, key: bytes, now: float) -> Ticket:
    """The request's valid ticket; ``Refusal`` 407 otherwise (the reason only in the log)."""
    challenge = 'Proxy-Authenticate: Basic realm="cdi-import-proxy"\r\n'
    values = request.header("proxy-authorization")
    scheme, _, token = (values[0] if len(values) == 1 else "").partition(" ")
    try:
        user, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
        if scheme.lower() != "basic" or not sep:
            raise TicketRefused("no Basic ticket")
        return check(user, password, key, now)
    except (TicketRefused, binascii.Error, UnicodeDecodeError) as exc:
        log.info("refused a %s request: %s", request.method, getattr(exc, "reason", "no ticket"))
        raise Refusal(407, "Proxy Authentication Required", challenge) from None


def forwarded_head(request: Request, upstream: Upstream) -> bytes:
    """The head for the upstream proxy: the ticket replaced by the upstream's credentials."""
    lines = [f"{request.method} {request.target} {request.version}"]
    lines += [f"{k}: {v}" for k, v in request.headers if k.lower() not in _DROPPED]
    if upstream.authorization:
        lines.append(f"Proxy-Authorization: {upstream.authorization}")
    if request.method != "CONNECT":
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def _upstream_for(request: Request, upstreams: Upstreams) -> Upstream:
    if request.method not in METHODS:
        raise Refusal(405, "Method Not Allowed")
    if request.method != "CONNECT" and not request.target.startswith("http://"):
        raise Refusal(400, "Bad Request")
    upstream = upstreams.https if request.method == "CONNECT" else upstreams.http
    if upstream is None:
        raise Refusal(502, "Bad Gateway")
    return upstream


class _Idle:
    """When bytes last moved either way: a download keeps the quiet upward direction alive."""

    def __init__(self, limit: float) -> None:
        self.limit, self.last = limit, time.monotonic()

    def moved(self) -> None:
        self.last = time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() - self.last >= self.limit


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, idle: _Idle) -> None:
    with contextlib.suppress(ConnectionError, TimeoutError):  # a write stuck past the limit
        while True:
            try:
                data = await asyncio.wait_for(src.read(_PIECE), idle.limit)
            except TimeoutError:
                if idle.expired():
                    return
                continue
            if not data:
                break
            idle.moved()
            dst.write(data)
            await asyncio.wait_for(dst.drain(), idle.limit)
        if dst.can_write_eof():
            dst.write_eof()
        else:  # TLS to an https:// upstream has no half-close: end it, or it waits for idle
            dst.close()


async def _status_line(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, idle: _Idle, upstream: Upstream
) -> None:
    """Pass on the upstream's status line, logging a 407: the operator's credentials were
    refused (the importer names the 407 to the tenant; the operator learns it here)."""
    try:
        line = await asyncio.wait_for(src.readuntil(b"\n"), idle.limit)
    except asyncio.IncompleteReadError as cut:
        line = cut.partial
    except asyncio.LimitOverrunError:
        raise ConnectionError("the upstream's status line is too long") from None
    if line.split(b" ", 2)[1:2] == [b"407"]:
        log.warning(
            "upstream proxy %s:%d refused the credentials of CDIConfig importProxy (407)",
            upstream.host,
            upstream.port,
        )
    idle.moved()
    dst.write(line)


class ImportProxyRelay:
    def __init__(
        self,
        key: bytes,
        upstreams: Callable[[], Awaitable[Upstreams]],
        config: RelayConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.key, self.upstreams, self.clock = key, upstreams, clock
        self.config = config or RelayConfig()
        self._slots = AddressSlots(
            self.config.max_connections, self.config.max_connections_per_address
        )
        self._server: asyncio.Server | None = None

    @property
    def active(self) -> int:
        return self._slots.in_use

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(
            self._handle, host, port, limit=self.config.max_head
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        if not self._slots.take(address):
            writer.close()
            return
        try:
            await self._serve(reader, writer)
        except Refusal as refusal:
            with contextlib.suppress(ConnectionError):
                writer.write(refusal.answer())
                await asyncio.wait_for(writer.drain(), self.config.head_timeout)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._slots.give(address)
            writer.close()

    async def _dial(self, upstream: Upstream) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        where = f"{upstream.host}:{upstream.port}"
        hostname = upstream.host if upstream.tls is not None else None
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(
                    upstream.host,
                    upstream.port,
                    limit=_PIECE,
                    ssl=upstream.tls,
                    server_hostname=hostname,
                ),
                self.config.connect_timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            log.warning(
                "upstream proxy %s: TLS not trusted (%s); its CA belongs in the ConfigMap "
                "CDIConfig importProxy.trustedCAProxy names",
                where,
                exc.verify_message,
            )
        except ssl.SSLError as exc:  # a handshake that fails otherwise (protocol, alert ...)
            log.warning(
                "upstream proxy %s: TLS failed (%s)", where, exc.reason or type(exc).__name__
            )
        except (OSError, TimeoutError):
            log.warning("upstream proxy %s unreachable", where)
        raise Refusal(502, "Bad Gateway")

    async def _head(self, reader: asyncio.StreamReader) -> Request:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.config.head_timeout)
        except asyncio.LimitOverrunError:
            raise Refusal(431, "Request Header Fields Too Large") from None
        return parse_head(head)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await self._head(reader)
        ticket = ticket_of(request, self.key, self.clock())
        upstream = _upstream_for(request, await self.upstreams())
        up_reader, up_writer = await self._dial(upstream)
        log.info("%s for %s/%s", request.method, ticket.namespace, ticket.claim)
        try:
            up_writer.write(forwarded_head(request, upstream))
            idle = _Idle(self.config.idle_timeout)
            upward = asyncio.create_task(_pump(reader, up_writer, idle))
            try:
                await _status_line(up_reader, writer, idle, upstream)
                await _pump(up_reader, writer, idle)
            finally:
                upward.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await upward
        finally:
            up_writer.close()
