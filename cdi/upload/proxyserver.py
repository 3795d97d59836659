"""The upload proxy's HTTPS server: one thread and one blocking TLS socket per connection.

``UploadProxy(targets, verify, upstream_tls, config)``; ``await proxy.start(host, port, tls)``
binds and returns the port, ``await proxy.stop()`` stops accepting, lets uploads in flight
finish for ``shutdown_grace`` seconds and closes the rest. Routes: ``GET /healthz`` -> 200
``OK``; ``POST``, ``HEAD``, ``PATCH`` on ``proxy.UPLOAD_PATHS`` -> CDI's checks
(``proxy.Gate``) then the relay (``relay.py``); ``OPTIONS`` there -> the CORS preflight (204);
other paths 404, other methods 405.

Why it is shaped so: the bytes of an upload must not cross an event loop (asyncio's TLS
costs the proxy more CPU than the upload server spends converting, see ``http1.py``), while
CDI's checks read the cluster through async clients. So the event loop the process already
runs keeps two jobs: it accepts connections (a reader on the listening socket, which also
makes ``stop`` clean), and it runs ``Gate.admit`` for the connection threads
(``run_coroutine_threadsafe``). Each connection's thread does the TLS handshake
(``TlsStream``), reads heads, and relays; a refusal is written by the thread, HTML-escaped,
with the CORS header when the request had an ``Origin``.

What a client that has not shown a token can hold (security review 3, N3): one of
``max_connections`` slots, at most ``max_connections_per_address`` of them per client
address (more are closed at accept); for ``handshake_timeout`` seconds in total for the
TLS handshake and ``head_timeout`` seconds in total for each request head (a watchdog,
``wire.connlimit.Deadlines``, shuts the socket: a byte now and then does not extend
either); a few KiB of TLS buffer (``TlsStream`` widens it for an admitted upload only); and
each answer it does not read blocks its thread for ``write_timeout`` seconds at most.
"""

from __future__ import annotations

import asyncio
import http
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable

from cdi.upload.errors import UploadError, UploadInterrupted
from cdi.upload.proxy import (
    PREFLIGHT_METHODS,
    RELAYED_METHODS,
    UPLOAD_PATHS,
    Gate,
    ProxyConfig,
    TokenVerifier,
    cors,
    refusal_body,
)
from cdi.upload.readiness import UploadTargets
from cdi.upload.relay import Relay, keep_alive, tune
from wire.connlimit import AddressSlots, Deadlines
from wire.http1 import (
    NO_BODY,
    Framing,
    Head,
    HttpError,
    SourceEnded,
    Wire,
    request_framing,
)
from wire.tlsstream import TlsStream

log = logging.getLogger(__name__)

LINGER_SECONDS = 2.0  # after refusing a request whose body was not read: let the answer land


class _Answer:
    """A short answer the proxy writes itself (health, preflight, refusals, 404, 405)."""

    def __init__(
        self, status: int, body: bytes = b"", headers: list[tuple[str, str]] | None = None
    ):
        self.status, self.body, self.headers = status, body, headers or []

    def encode(self, head_only: bool, origin: str | None, close: bool) -> bytes:
        headers = list(self.headers)
        if self.status != 204:
            headers += [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(self.body))),
            ]
        headers += cors(origin)
        if close:
            headers.append(("Connection", "close"))
        phrase = http.HTTPStatus(self.status).phrase
        head = Head(("HTTP/1.1", str(self.status), phrase), headers).encode()
        return head if head_only or self.status == 204 else head + self.body


def _plain(status: int) -> _Answer:
    return _Answer(status, f"{status}: {http.HTTPStatus(status).phrase}".encode())


class UploadProxy:
    def __init__(
        self,
        targets: UploadTargets,
        verify: TokenVerifier,
        upstream_tls: ssl.SSLContext,
        config: ProxyConfig | None = None,
        refresh_upstream: Callable[[], ssl.SSLContext | None] | None = None,
    ) -> None:
        config = config or ProxyConfig()
        self.gate = Gate(targets, verify, config)
        self.relay = Relay(upstream_tls, config, refresh_upstream)
        self.config = config
        self.tls: ssl.SSLContext | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listener: socket.socket | None = None
        self.connections: dict[threading.Thread, socket.socket] = {}
        self.busy: set[threading.Thread] = set()
        self.slots = AddressSlots(config.max_connections, config.max_connections_per_address)
        self.deadlines = Deadlines("upload-proxy-deadlines")

    async def start(self, host: str, port: int, tls: ssl.SSLContext) -> int:
        """Listen on ``host:port`` (0: any free port) with ``tls``; the port listened on."""
        self.loop, self.tls = asyncio.get_running_loop(), tls
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
        self.listener = socket.create_server((host, port), family=family, backlog=128)
        self.listener.setblocking(False)
        self.loop.add_reader(self.listener.fileno(), self._accept)
        return int(self.listener.getsockname()[1])

    def use(
        self, serving: ssl.SSLContext | None = None, upstream: ssl.SSLContext | None = None
    ) -> None:
        """Rotated certificates: new connections (and dials) use these contexts."""
        if serving is not None:
            self.tls = serving
        if upstream is not None:
            self.relay.tls = upstream

    async def stop(self) -> None:
        if self.listener is not None and self.loop is not None:
            self.loop.remove_reader(self.listener.fileno())
            self.listener.close()
        await asyncio.to_thread(self._drain)

    def _drain(self) -> None:
        deadline = time.monotonic() + self.config.shutdown_grace
        for thread, sock in list(self.connections.items()):
            if thread not in self.busy:
                _shut(sock)
        for thread in list(self.connections):
            thread.join(max(0.0, deadline - time.monotonic()))
        for thread, sock in list(self.connections.items()):
            _shut(sock)
            thread.join(5.0)

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                raw, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: keep serving the others
                log.warning("accepting a connection failed: %s", exc)
                return
            address = str(peer[0])
            if not self.slots.take(address):
                raw.close()
                continue
            raw.setblocking(True)
            thread = threading.Thread(target=self._connection, args=(raw, address), daemon=True)
            self.connections[thread] = raw
            thread.start()

    def _connection(self, raw: socket.socket, address: str) -> None:
        me = threading.current_thread()
        tls = self.tls
        handshake = self.deadlines.arm(raw, self.config.handshake_timeout)
        try:
            assert tls is not None
            tune(raw)
            raw.settimeout(self.config.handshake_timeout)
            with TlsStream.accept(raw, tls) as sock:
                handshake.cancel()
                wire = Wire(sock)
                while self._exchange(sock, wire, me):
                    pass
        except (OSError, ssl.SSLError) as exc:
            log.debug("connection ended: %s", exc)
        except Exception:  # never a traceback to a tenant; the connection just ends
            log.exception("the upload proxy failed on a connection")
        finally:
            handshake.cancel()
            self.busy.discard(me)
            self.connections.pop(me, None)
            raw.close()
            self.slots.give(address)

    def _read_head(self, sock: TlsStream, wire: Wire) -> Head | None:
        """The next request head, within ``head_timeout`` seconds in total; afterwards every
        write to the client may take ``write_timeout`` seconds at most."""
        deadline = self.deadlines.arm(sock.raw, self.config.head_timeout)
        sock.settimeout(self.config.head_timeout)
        try:
            return wire.read_head()
        finally:
            deadline.cancel()
            sock.settimeout(self.config.write_timeout)

    def _exchange(self, sock: TlsStream, wire: Wire, me: threading.Thread) -> bool:
        """Serve one request; whether the connection stays open for another."""
        self.busy.discard(me)
        try:
            head = self._read_head(sock, wire)
        except HttpError as exc:
            sock.sendall(_Answer(exc.status, str(exc).encode()).encode(False, None, True))
            return False
        except SourceEnded:
            return False
        if head is None:
            return False
        self.busy.add(me)
        origin = head.get("Origin")
        try:
            if head.start[2] not in ("HTTP/1.1", "HTTP/1.0"):
                raise HttpError("HTTP/1.1 only", 505)
            framing = request_framing(head)
        except HttpError as exc:
            sock.sendall(_Answer(exc.status, str(exc).encode()).encode(False, origin, True))
            return False
        return self._route(sock, wire, head, framing, origin)

    def _route(
        self, sock: TlsStream, wire: Wire, head: Head, framing: Framing, origin: str | None
    ) -> bool:
        method, target = head.start[0], head.start[1]
        path = target.split("?", 1)[0]
        if path in UPLOAD_PATHS and method in RELAYED_METHODS:
            return self._upload(sock, wire, head, framing, path, origin)
        if path == "/healthz" and method in ("GET", "HEAD"):
            answer = _Answer(200, b"OK")
        elif path in UPLOAD_PATHS and method == "OPTIONS":
            answer = _preflight(head)
        elif path in UPLOAD_PATHS or path == "/healthz":
            allowed = "GET, HEAD" if path == "/healthz" else "POST, HEAD, PATCH, OPTIONS"
            answer = _plain(405)
            answer.headers.append(("Allow", allowed))
        else:
            answer = _plain(404)
        keep = framing is NO_BODY and keep_alive(head)
        sock.sendall(answer.encode(method == "HEAD", origin, not keep))
        return keep

    def _upload(
        self,
        sock: TlsStream,
        wire: Wire,
        head: Head,
        framing: Framing,
        path: str,
        origin: str | None,
    ) -> bool:
        assert self.loop is not None
        admit = self.gate.admit(head.get("Authorization"), path)
        try:
            target = asyncio.run_coroutine_threadsafe(admit, self.loop).result()
            return self.relay(wire, head, framing, target, origin)
        except UploadError as err:
            keep = framing is NO_BODY and keep_alive(head)
            answer = _Answer(err.status, refusal_body(err))
            sock.sendall(answer.encode(head.start[0] == "HEAD", origin, not keep))
            if framing is not NO_BODY and not isinstance(err, UploadInterrupted):
                _linger(sock, head)
            return keep
        except HttpError as exc:  # a malformed chunked body
            sock.sendall(_Answer(exc.status, str(exc).encode()).encode(False, origin, True))
            return False
        except (OSError, ssl.SSLError):
            raise  # the uploader's connection failed: nobody to answer
        except Exception:  # a bug, or a cluster read that failed untyped: no traceback out
            log.exception("upload request failed")
            answer = _Answer(500, b"error in upload-proxy")
            sock.sendall(answer.encode(head.start[0] == "HEAD", origin, True))
            return False


def _preflight(head: Head) -> _Answer:
    headers = [("Access-Control-Allow-Methods", PREFLIGHT_METHODS)]
    asked = head.get("Access-Control-Request-Headers")
    if asked:
        headers.append(("Access-Control-Allow-Headers", asked))
    return _Answer(204, headers=headers)


def _linger(sock: TlsStream, head: Head) -> None:
    """Read (and drop) what the uploader still sends for a moment before closing: closing a
    socket with unread bytes resets the connection, which can destroy the answer in flight.
    An uploader that waits for ``100 Continue`` sends nothing: no need to wait."""
    expect = head.get("Expect")
    if expect is not None and expect.lower() == "100-continue":
        return
    deadline = time.monotonic() + LINGER_SECONDS
    buf = memoryview(bytearray(64 * 1024))
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv_into(buf):
                return
    except (OSError, ssl.SSLError):
        return


def _shut(sock: socket.socket) -> None:
    """Wake the connection's thread blocked on ``sock`` (it reads an end of stream)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
