"""One blocking HTTP/1.1 exchange on the standard library's ``http.client``, for the data path.

Why not aiohttp for the image bytes: on the event loop every 256 KiB the socket delivers goes
through a protocol callback, a parser and a stream buffer, and 4 MiB chunks are joined again;
profiling a 632 MB qcow2 import showed ~0.55 s of CPU on the loop thread, competing for the GIL
with the decoder, plus ~0.2 s of start-up (importing aiohttp and building its TLS contexts even
for ``http://``). ``HTTPResponse.read`` on a worker thread fills a 4 MiB bytes object straight
from the socket with the GIL released: the same bytes cost one kernel copy. The import pod
runs one request at a time per connection, so a thread per connection is cheap.

What is handled here, once: proxies (absolute-form requests for ``http://``, a CONNECT tunnel
for ``https://``), TLS with the caller's context, redirects (at most ``MAX_REDIRECTS``) with the
``Authorization`` header sent only to the origin the user named, timeouts for connect and for
each read. Retries, ranges and resumption are the source's business (``importer.sources.http``).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

from cdi.api.errors import InvalidConfig, SourceUnavailable
from datapath.streams import CHUNK_SIZE

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


def _proxy(proxy: str) -> tuple[str, int, str | None]:
    """(host, port, Proxy-Authorization value) of an http:// proxy URL."""
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme != "http":
        raise InvalidConfig(f"proxy {proxy}: only http:// proxies are supported")
    auth = None
    if parts.username is not None:
        auth = basic_auth(unquote(parts.username), unquote(parts.password or ""))
    return parts.hostname or "", parts.port or 80, auth


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

    url: str
    headers: Mapping[str, str]
    authorization: str | None  # sent only to the origin of ``url``
    tls: Callable[[], ssl.SSLContext]  # built on first use: https only
    proxy_for: Callable[[str], str | None]
    connect_timeout: float = 60.0
    read_timeout: float = 600.0
    pool: ConnectionPool | None = None  # reuse keep-alive connections when given

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
            url = urljoin(url, location)
            if urlsplit(url).scheme not in ("http", "https"):
                raise SourceUnavailable(f"{self.url} redirects to {url}, which is not HTTP(S)")
            if exchange.status == 303 and method != "HEAD":
                method = "GET"
        raise SourceUnavailable(f"{self.url} redirects more than {MAX_REDIRECTS} times")

    def _send(self, method: str, url: str, extra: Mapping[str, str]) -> Exchange:
        headers = {**self.headers, **extra}
        if self.authorization and _endpoint(url) == _endpoint(self.url):
            headers["Authorization"] = self.authorization
        key, target = self._route(url, headers)
        idle = self.pool.take(key) if self.pool is not None else None
        if idle is not None:
            try:
                return self._exchange(idle, method, target, headers, url, key)
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                pass  # the server closed it while it was idle: a GET/HEAD is safe to resend
        conn = self._connection(key)
        try:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(self.read_timeout)
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
            auth = _proxy(proxy)[2]
            if auth is not None:
                headers["Proxy-Authorization"] = auth
            target = url  # absolute form: the proxy forwards it
        return (scheme, host, port, proxy), target

    def _connection(self, key: RouteKey) -> http.client.HTTPConnection:
        """A new, not yet connected, connection for a route."""
        scheme, host, port, proxy = key
        if proxy is None:
            if scheme == "https":
                return self._https(host, port)
            return http.client.HTTPConnection(host, port, timeout=self.connect_timeout)
        proxy_host, proxy_port, auth = _proxy(proxy)
        if scheme == "https":  # TLS end to end through a CONNECT tunnel
            conn = self._https(proxy_host, proxy_port)
            conn.set_tunnel(host, port, headers={"Proxy-Authorization": auth} if auth else {})
            return conn
        return http.client.HTTPConnection(proxy_host, proxy_port, timeout=self.connect_timeout)

    def _https(self, host: str, port: int) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            host, port, timeout=self.connect_timeout, context=self.tls()
        )


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
