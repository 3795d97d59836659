"""One blocking HTTP/1.1 exchange on the standard library's ``http.client``, for the data path.

Why not aiohttp for the image bytes: on the event loop every 256 KiB the socket delivers goes
through a protocol callback, a parser and a stream buffer, and 4 MiB chunks are joined again;
profiling a 632 MB qcow2 import showed ~0.55 s of CPU on the loop thread, competing for the GIL
with the decoder, plus ~0.2 s of start-up (importing aiohttp and building its TLS contexts even
for ``http://``). ``HTTPResponse.read`` on a worker thread fills a 4 MiB bytes object straight
from the socket with the GIL released: the same bytes cost one kernel copy. The import pod
runs one request at a time per connection, so a thread per connection is cheap.

What is handled here, once: proxies (absolute-form requests for ``http://``, a CONNECT tunnel
for ``https://``; an ``https://`` proxy gets TLS of its own, ``importer.sources.proxy_tls``; a
proxy's 407, to a CONNECT or to a forwarded request, is a permanent ``ProxyAuthenticationFailed``
naming the proxy), TLS with the caller's context, redirects (at most ``MAX_REDIRECTS``) with the
``Authorization`` header sent only to the origin the user named, timeouts for connect and for
each read. Retries, ranges and resumption are the source's business (``importer.sources.http``).

Every connection goes through a ``Dialer``: the host is resolved once, every address it
resolves to is checked against the import's ``NetPolicy`` (``cdi.api.netpolicy``), and the
socket is connected to a checked address, never to the name again, so DNS rebinding between
check and connect is impossible; TLS still verifies the certificate against the host name (SNI
and ``check_hostname`` use the connection's host, only the TCP dial is ours). This holds for each
redirect hop, range segment, retry and resume, since all of them open connections here.
Through a proxy the proxy itself is trusted (the operator configured it) and the destination is
checked only when it is an address literal: a name is resolved by the proxy, out of our reach.
Redirects may not leave HTTP(S) nor go from https to http, and a ``Location`` must be printable
ASCII. Credentials (``Authorization`` and the secret extra headers) go only to the origin the
user named; userinfo in a URL is never put into a request line or a ``Host`` header.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from cdi.api.errors import (
    InvalidConfig,
    ProxyAuthenticationFailed,
    SourceForbidden,
    SourceUnavailable,
)
from cdi.api.netpolicy import Address, NetPolicy, parse_address
from cdi.api.redact import redact_url
from datapath.streams import CHUNK_SIZE
from importer.sources.proxy_tls import ProxyTlsConnection, TunnelRefused, TypedTunnel

MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def basic_auth(username: str, password: str) -> str:
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def _endpoint(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``: its origin. The port is always explicit, because
    http.client would read an IPv6 literal's last group as a port if left to split
    "host:port" itself."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def without_userinfo(url: str) -> str:
    """``url`` with no ``user:password@`` and no fragment: what may go on the wire."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def userinfo_authorization(url: str) -> str | None:
    """Basic credentials written into the URL (``https://user:pass@host/``), as Go's client
    (and so CDI) uses them; None when the URL has none."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    return basic_auth(unquote(parts.username), unquote(parts.password or ""))


Resolver = Callable[[str, int], Sequence[str]]  # (host, port) -> addresses
# (method, url) -> headers that authenticate that one request (S3's SigV4): computed at send
# time, so every retry, redirect hop to the same origin and resumed range is signed afresh.
RequestSigner = Callable[[str, str], Mapping[str, str]]


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def proxy_auth_refused(proxy: str) -> ProxyAuthenticationFailed:
    """The one message for a proxy's 407, to a CONNECT or to a forwarded request: the proxy
    without its userinfo, never the credentials."""
    return ProxyAuthenticationFailed(
        f"the import proxy {redact_url(proxy)} answered 407 Proxy Authentication Required: "
        "it refused the proxy credentials (the user and password of CDIConfig importProxy, "
        "or --proxy)"
    )


def policy_refusal(origin: str, why: str) -> SourceForbidden:
    """The one message for a refused destination: the same whatever listens there."""
    return SourceForbidden(f"{origin}: destination not allowed by the import policy ({why})")


@dataclass(frozen=True)
class Dialer:
    """Resolve once, check every address, connect to a checked address (see the module doc)."""

    policy: NetPolicy = field(default_factory=NetPolicy)
    resolve: Resolver = system_resolver

    def addresses(self, host: str, port: int, origin: str) -> list[Address]:
        """The addresses of ``host``, all allowed, or ``SourceForbidden`` if any is not: a
        name that also resolves to a refused address is refused whole."""
        literal = parse_address(host)
        if literal is not None:
            found = [literal]
        else:
            found = [a for a in map(parse_address, self.resolve(host, port)) if a is not None]
        for address in found:
            why = self.policy.refusal(address)
            if why is not None:
                raise policy_refusal(origin, why)
        return found

    def check_literal(self, url: str) -> None:
        """For a destination a proxy resolves: refuse it if it is a refused address literal."""
        scheme, host, port = _endpoint(url)
        literal = parse_address(host)
        why = self.policy.refusal(literal) if literal is not None else None
        if why is not None:
            raise policy_refusal(f"{scheme}://{_bracket(host)}:{port}", why)

    def connect(self, host: str, port: int, timeout: float | None, origin: str) -> socket.socket:
        last: OSError = OSError(f"{host} has no address")
        for address in self.addresses(host, port, origin):
            try:
                return socket.create_connection((str(address), port), timeout)
            except OSError as exc:
                last = exc
        raise last


def _proxy(proxy: str) -> tuple[str, str, int, str | None]:
    """(scheme, host, port, Proxy-Authorization value) of an http:// or https:// proxy URL."""
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme not in ("http", "https"):
        raise InvalidConfig(
            f"proxy {redact_url(proxy)}: only http:// and https:// proxies are supported"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname or "", port, userinfo_authorization(parts.geturl())


RouteKey = tuple[str, str, int, str | None]  # scheme, host, port, proxy


class ConnectionPool:
    """Idle keep-alive connections, by route. Parallel range segments (8 MiB each) reuse them
    instead of paying a TCP handshake, and for https a TLS handshake, per segment: on a WAN
    link with 50 ms of round trip that alone would cost more than the segment's transfer."""

    MAX_IDLE = 8

    def __init__(self) -> None:
        self._idle: dict[RouteKey, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def take(self, key: RouteKey) -> http.client.HTTPConnection | None:
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def give(self, key: RouteKey, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.MAX_IDLE:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


@dataclass(frozen=True)
class Client:
    """How to reach one user-named URL: headers, credentials, trust, proxy, timeouts."""

    url: str  # without userinfo (``without_userinfo``)
    headers: Mapping[str, str]
    authorization: str | None  # sent only to the origin of ``url``
    tls: Callable[[], ssl.SSLContext]  # built on first use: https only
    proxy_for: Callable[[str], str | None]
    origin_headers: Mapping[str, str] = field(default_factory=dict)  # secret: origin only
    dialer: Dialer = field(default_factory=Dialer)
    connect_timeout: float = 60.0
    read_timeout: float = 600.0
    pool: ConnectionPool | None = None  # reuse keep-alive connections when given
    signer: RequestSigner | None = None  # per-request credentials: origin only, like the rest
    # an https:// proxy's TLS: the system's CAs and importProxy.trustedCAProxy, always verified
    proxy_tls: Callable[[], ssl.SSLContext] = ssl.create_default_context

    def open(self, method: str, extra: Mapping[str, str] | None = None) -> Exchange:
        """Send ``method`` for ``self.url``, following redirects; the final response's
        status may be anything (the caller judges it)."""
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            exchange = self._send(method, url, extra or {})
            location = exchange.response.getheader("Location")
            if exchange.status not in _REDIRECTS or not location:
                return exchange
            exchange.close()
            url = self._follow(url, location)
            if exchange.status == 303 and method != "HEAD":
                method = "GET"
        raise SourceUnavailable(
            f"{redact_url(self.url)} redirects more than {MAX_REDIRECTS} times", transient=False
        )

    def _follow(self, url: str, location: str) -> str:
        """The next hop of a redirect, or a typed refusal."""
        shown = redact_url(url)
        if not location.isascii() or not location.isprintable() or " " in location:
            raise SourceUnavailable(
                f"{shown} redirects to a Location that is not printable ASCII", transient=False
            )
        target = urljoin(url, location)
        scheme = urlsplit(target).scheme
        if scheme not in ("http", "https"):
            raise SourceUnavailable(
                f"{shown} redirects to {redact_url(target)}, which is not HTTP(S)",
                transient=False,
            )
        if urlsplit(url).scheme == "https" and scheme == "http":
            raise SourceForbidden(f"{shown} redirects from https to http: downgrade refused")
        return without_userinfo(target)

    def _send(self, method: str, url: str, extra: Mapping[str, str]) -> Exchange:
        headers = {**self.headers, **extra}
        if _endpoint(url) == _endpoint(self.url):
            headers.update(self.origin_headers)
            if self.authorization:
                headers["Authorization"] = self.authorization
            if self.signer is not None:
                headers.update(self.signer(method, url))
        key, target = self._route(url, headers)
        exchange = self._dispatch(key, method, target, headers, url)
        if exchange.status == 407 and key[3] is not None and key[0] == "http":
            exchange.close()  # the proxy itself answered the absolute-form request
            raise proxy_auth_refused(key[3])
        return exchange

    def _dispatch(
        self, key: RouteKey, method: str, target: str, headers: dict[str, str], url: str
    ) -> Exchange:
        idle = self.pool.take(key) if self.pool is not None else None
        if idle is not None:
            try:
                return self._exchange(idle, method, target, headers, url, key)
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                pass  # the server closed it while it was idle: a GET/HEAD is safe to resend
        if key[3] is not None:
            self.dialer.check_literal(url)
        conn = self._connection(key)
        try:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(self.read_timeout)
        except TunnelRefused as exc:
            conn.close()
            if exc.status == 407 and key[3] is not None:
                raise proxy_auth_refused(key[3]) from None
            raise
        except BaseException:
            conn.close()
            raise
        return self._exchange(conn, method, target, headers, url, key)

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        target: str,
        headers: dict[str, str],
        url: str,
        key: RouteKey,
    ) -> Exchange:
        try:
            conn.request(method, target, headers=headers)
            return Exchange(conn, conn.getresponse(), url, self.pool, key)
        except BaseException:
            conn.close()
            raise

    def _route(self, url: str, headers: dict[str, str]) -> tuple[RouteKey, str]:
        """Where a request for ``url`` goes (the pool's key) and its request target: the
        absolute URL through a plain-http proxy, which also gets the proxy's credentials in
        ``headers``; the path otherwise (https goes through a CONNECT tunnel)."""
        scheme, host, port = _endpoint(url)
        proxy = self.proxy_for(url)
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if proxy is not None and scheme == "http":
            auth = _proxy(proxy)[3]
            if auth is not None:
                headers["Proxy-Authorization"] = auth
            target = without_userinfo(url)  # absolute form: the proxy forwards it
        return (scheme, host, port, proxy), target

    def _connection(self, key: RouteKey) -> http.client.HTTPConnection:
        """A new, not yet connected, connection for a route. Direct connections dial
        through the ``Dialer``; a proxy is dialled as configured."""
        scheme, host, port, proxy = key
        if proxy is None:
            if scheme == "https":
                conn: http.client.HTTPConnection = self._https(host, port)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self.connect_timeout)
            origin = f"{scheme}://{_bracket(host)}:{port}"

            def dial(address: tuple[str, int], timeout: float | None, *_: object) -> socket.socket:
                return self.dialer.connect(address[0], address[1], timeout, origin)

            # http.client's documented-in-source seam for the TCP dial; TLS wrapping (SNI,
            # certificate check against ``host``) happens after it, unchanged.
            conn._create_connection = dial  # type: ignore[attr-defined]
            return conn
        proxy_scheme, proxy_host, proxy_port, auth = _proxy(proxy)
        tunnel_headers = {"Proxy-Authorization": auth} if auth else {}
        if proxy_scheme == "https":  # TLS to the proxy (importer.sources.proxy_tls)
            secure = ProxyTlsConnection(
                proxy,
                proxy_host,
                proxy_port,
                self.proxy_tls(),
                self.tls() if scheme == "https" else None,
                self.connect_timeout,
            )
            if scheme == "https":  # and the destination's TLS inside a CONNECT tunnel
                secure.set_tunnel(host, port, headers=tunnel_headers)
            return secure
        if scheme == "https":  # TLS end to end through a CONNECT tunnel
            tunnel = self._https(proxy_host, proxy_port)
            tunnel.set_tunnel(host, port, headers=tunnel_headers)
            return tunnel
        return http.client.HTTPConnection(proxy_host, proxy_port, timeout=self.connect_timeout)

    def _https(self, host: str, port: int) -> http.client.HTTPSConnection:
        return _HttpsConnection(host, port, timeout=self.connect_timeout, context=self.tls())


class _HttpsConnection(TypedTunnel, http.client.HTTPSConnection):
    """An https connection whose CONNECT tunnel (through an http:// proxy) reports a refusal
    with its status (``TunnelRefused``)."""


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Exchange:
    """A response being read. ``read_chunk`` may run on another thread than ``close``."""

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        url: str,
        pool: ConnectionPool | None = None,
        key: RouteKey | None = None,
    ) -> None:
        self.conn = conn
        self.response = response
        self.url = url  # after redirects
        self.status = response.status
        self._pool, self._key = pool, key

    def header(self, name: str, default: str = "") -> str:
        return self.response.getheader(name, default) or default

    @property
    def content_length(self) -> int | None:
        value = self.response.getheader("Content-Length")
        if value is None or self.response.getheader("Transfer-Encoding"):
            return None
        try:
            length = int(value)
        except ValueError:
            return None
        return length if length >= 0 else None

    def read_chunk(self) -> bytes:
        """Up to CHUNK_SIZE body bytes (a full chunk unless the body ends); b"" at the end.
        A cut connection shows as an exception or as an early end (the caller compares
        with the expected length)."""
        # read(n) of a plain body lets the BufferedReader receive straight into the new bytes
        # object: no copy after the kernel's (readinto a bytearray would need one more).
        return self.response.read(CHUNK_SIZE)

    def close(self) -> None:
        """Done with the response: a connection whose body was read to its end and that the
        server keeps alive goes back to the pool; any other is closed, and a read blocked on
        another thread returns at once."""
        reusable = self.response.isclosed() and not self.response.will_close
        if reusable and self._pool is not None and self._key is not None:
            self._pool.give(self._key, self.conn)
            return
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.response.close()
        self.conn.close()
