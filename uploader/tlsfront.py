"""The upload server's TLS front: TLS on threads, plain HTTP to the aiohttp app over a socket pair.

Why: on asyncio's TLS transport every byte of an upload crosses ``SSLProtocol``'s memory BIOs
one record (16 KiB) per call with Python callbacks per piece, all on the event loop thread,
which also runs the data path: over half of the upload server's CPU in a filesystem clone
went there. Here the listening socket is accepted on the loop (one call per connection), and
each connection gets a thread that does the handshake and decrypts with ``TlsStream``
(blocking, OpenSSL with the GIL released, 256 KiB socket reads that yield many records per
call) and a second thread that encrypts the answers. The plaintext goes to the unchanged app
over ``socket.socketpair()``: aiohttp serves a plain connection and receives the body in
pieces of up to 256 KiB, not 16 KiB.

What the app still needs from TLS is the verified client certificate's CN (CDI answers 401
without the right one). A socket pair carries no certificate, and nothing the client sends
can be trusted to say it, so the front keeps ``Peers``: a record per app-side connection
(keyed by its asyncio transport, weakly: gone with the connection), filled on the loop
before the first plaintext byte is forwarded. ``server.peer_common_name`` reads it.

Connection ends, each way:
- the client ends (close_notify, FIN, reset, TLS error): the app's side is shut for writing,
  so aiohttp sees the end of the stream; mid-body that is a cut (``ContentLengthError`` or
  a lost connection), which is what the tus resume and "body was cut" paths expect. aiohttp
  closes a connection whose peer ended, which ends the other direction (no half-open hang).
- the app closes: the client gets close_notify and the TCP connection is shut both ways,
  which also wakes the thread receiving from the client.
Backpressure holds end to end: each thread forwards one piece (<= 256 KiB) and reads the next
only once the other side took it; the socket pair's buffers are the kernel's, bounded.
``TlsFrontSite.wait_closed`` joins every thread after the app has shut down (forcing the
stragglers' sockets shut), so nothing leaks.

What anyone who reaches the pod can hold (security review 3, N4), ``FrontLimits``: the TLS
layer requires a client certificate from the client CA (``CERT_REQUIRED``: a client without
one fails the handshake, and nothing of the app is spent on it); a handshake has
``handshake_timeout`` seconds in total (a watchdog, ``wire.connlimit.Deadlines``, shuts
the socket: trickled bytes do not extend it), a few KiB of buffer, and one of
``max_handshakes`` slots, at most ``handshakes_per_address`` per client address (more are
closed at accept). Only a verified client gets one of the ``max_connections`` connection
slots (waiting up to ``HAND_OVER_TIMEOUT`` for one) and the large buffers; its first request
head must be through within ``head_timeout`` seconds of the handshake.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from wire.connlimit import AddressSlots, Deadline, Deadlines
from wire.tlsstream import TlsStream

log = logging.getLogger("uploader")

HAND_OVER_TIMEOUT = 30.0  # a connection slot; the loop registering the app's side
UPSTREAM_PIECE = 256 * 1024  # plaintext forwarded to the app per call (one socket read's worth)
DOWNSTREAM_PIECE = 64 * 1024  # answers are small
PAIR_BUFFER = 1024 * 1024  # the socket pair's send buffer: fewer wake-ups of the loop
DRAIN_GRACE = 10.0  # seconds the last answers get to leave at shutdown
ProtocolFactory = Callable[[], asyncio.Protocol]
HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True)
class FrontLimits:
    handshake_timeout: float = 10.0  # in total, from accept
    head_timeout: float = 30.0  # in total, from the handshake to the end of the first head
    max_handshakes: int = 128  # a thread and a few KiB each
    handshakes_per_address: int = 8  # the proxy and a clone source use one or two at a time
    max_connections: int = 64  # verified clients


def common_name(cert: Any) -> str | None:
    """The subject CN of a certificate as ``getpeercert()`` answers it (None without one)."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class Peers:
    """The client certificate CN the front verified for each app-side connection."""

    def __init__(self) -> None:
        self._names: weakref.WeakKeyDictionary[asyncio.BaseTransport, str | None] = (
            weakref.WeakKeyDictionary()
        )

    def record(self, transport: asyncio.BaseTransport, name: str | None) -> None:
        self._names[transport] = name

    def knows(self, transport: asyncio.BaseTransport) -> bool:
        return transport in self._names

    def name(self, transport: asyncio.BaseTransport) -> str | None:
        return self._names.get(transport)


class TlsFront:
    """Accepts on a listening socket and serves each connection on two threads."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        app: ProtocolFactory,
        peers: Peers,
        loop: asyncio.AbstractEventLoop,
        limits: FrontLimits | None = None,
    ) -> None:
        self.ctx, self.app, self.peers, self.loop = ctx, app, peers, loop
        self.limits = limits = limits or FrontLimits()
        self.threads: set[threading.Thread] = set()
        self.sockets: set[socket.socket] = set()  # live client and front-side sockets
        self.handshaking: set[socket.socket] = set()  # clients not handed to the app yet
        self._lock = threading.Lock()
        self.handshakes = AddressSlots(limits.max_handshakes, limits.handshakes_per_address)
        self.connections = threading.BoundedSemaphore(limits.max_connections)
        self.deadlines = Deadlines("upload-server-deadlines")
        self.closing = False

    async def accept(self, listener: socket.socket) -> None:
        """Accept until cancelled; each connection goes to a thread of its own."""
        while True:
            try:
                client, peer = await self.loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and the like: the next accept may succeed
                log.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            address = str(peer[0])
            if not self.handshakes.take(address):
                client.close()
                continue
            thread = threading.Thread(target=self._serve, args=(client, address), daemon=True)
            thread.name = f"tlsfront-{client.fileno()}"
            with self._lock:
                self.threads.add(thread)
                self.sockets.add(client)
                self.handshaking.add(client)
            thread.start()

    def _serve(self, client: socket.socket, address: str) -> None:
        try:
            deadline = self.deadlines.arm(client, self.limits.handshake_timeout)
            try:
                tls = self._handshake(client)
            finally:
                deadline.cancel()
                self.handshakes.give(address)
            if tls is not None and self._connection_slot():
                try:
                    self._connect(tls)
                finally:
                    self.connections.release()
        finally:
            with self._lock:
                self.sockets.discard(client)
                self.handshaking.discard(client)
                self.threads.discard(threading.current_thread())
            client.close()

    def _connection_slot(self) -> bool:
        """One of ``max_connections``, waiting up to ``HAND_OVER_TIMEOUT`` (not past a stop)."""
        give_up = time.monotonic() + HAND_OVER_TIMEOUT
        while not self.closing and time.monotonic() < give_up:
            if self.connections.acquire(timeout=0.2):
                return True
        return False

    def _handshake(self, client: socket.socket) -> TlsStream | None:
        """The TLS handshake, the client's certificate verified (``CERT_REQUIRED``)."""
        try:
            client.settimeout(self.limits.handshake_timeout)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = TlsStream.accept(client, self.ctx)
            client.settimeout(None)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.debug("TLS handshake failed: %s", exc)  # probes connect and close, too
            return None
        return tls

    def _connect(self, tls: TlsStream) -> None:
        """Hand the app its side of a socket pair, recorded with the client's CN, then relay."""
        if self.closing:
            return
        tls.widen()  # a verified client: large socket reads from here on
        app_side, front_side = socket.socketpair()
        front_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PAIR_BUFFER)
        name = common_name(tls.getpeercert())
        handed: concurrent.futures.Future[None] | None = None
        try:
            handed = asyncio.run_coroutine_threadsafe(self._hand_over(app_side, name), self.loop)
            handed.result(HAND_OVER_TIMEOUT)
        except (RuntimeError, OSError, concurrent.futures.CancelledError, TimeoutError) as exc:
            log.info("the app did not take a connection: %s", exc or type(exc).__name__)
            if handed is not None:
                handed.cancel()
            app_side.close()
            front_side.close()
            return
        with self._lock:
            self.sockets.add(front_side)
            self.handshaking.discard(tls.raw)
        head = self.deadlines.arm(tls.raw, self.limits.head_timeout)
        try:
            self._relay(tls, front_side, head)
        finally:
            head.cancel()
            with self._lock:
                self.sockets.discard(front_side)
            front_side.close()

    async def _hand_over(self, app_side: socket.socket, name: str | None) -> None:
        if self.closing:
            raise ConnectionAbortedError("the upload server is shutting down")
        transport, _ = await self.loop.connect_accepted_socket(self.app, app_side)
        self.peers.record(transport, name)  # before the first byte is forwarded

    def _relay(self, tls: TlsStream, front_side: socket.socket, head: Deadline) -> None:
        upstream = threading.Thread(target=_upstream, args=(tls, front_side, head), daemon=True)
        upstream.name = threading.current_thread().name + "-up"
        with self._lock:
            self.threads.add(upstream)
        upstream.start()
        try:
            _downstream(tls, front_side)
        finally:
            with contextlib.suppress(OSError):
                tls.raw.shutdown(socket.SHUT_RDWR)  # wakes the upstream thread's receive
            upstream.join()
            with self._lock:
                self.threads.discard(upstream)

    def stop(self) -> None:
        """No more connections for the app: handshakes under way are dropped."""
        self.closing = True
        self.force_close(handshaking_only=True)

    def force_close(self, handshaking_only: bool = False) -> None:
        """Shut every live socket: the threads blocked on them return."""
        with self._lock:
            live = list(self.handshaking if handshaking_only else self.sockets)
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every connection's threads; True if none is left."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                alive = [t for t in self.threads if t.is_alive()]
            if not alive:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            alive[0].join(min(left, 0.1))


def _upstream(tls: TlsStream, front_side: socket.socket, head: Deadline) -> None:
    """Client -> app: decrypted pieces until the client ends; then the app sees the end.
    The ``head`` deadline is cancelled once the end of the first request head went by."""
    buf = memoryview(bytearray(UPSTREAM_PIECE))
    tail = b""  # the last bytes before this piece: the head's end may straddle two pieces
    try:
        while n := tls.recv_into(buf):
            if not head.cancelled:
                seen = tail + bytes(buf[:n])
                if HEAD_END in seen:
                    head.cancel()
                tail = seen[-(len(HEAD_END) - 1) :]
            front_side.sendall(buf[:n])
    except (OSError, ssl.SSLError) as exc:
        log.debug("client connection ended: %s", exc)
    finally:
        with contextlib.suppress(OSError):
            front_side.shutdown(socket.SHUT_WR)


def _downstream(tls: TlsStream, front_side: socket.socket) -> None:
    """App -> client: the answers, encrypted, until the app closes; then close_notify."""
    buf = memoryview(bytearray(DOWNSTREAM_PIECE))
    try:
        while n := front_side.recv_into(buf):
            tls.sendall(buf[:n])
    except (OSError, ssl.SSLError) as exc:
        log.debug("answering the client failed: %s", exc)
        return
    tls.close_notify()


class TlsFrontSite(web.BaseSite):
    """An aiohttp site served through ``TlsFront``: ``runner.cleanup()`` stops it like a
    ``TCPSite``; ``wait_closed`` then waits for the last answers to leave."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        peers: Peers,
        *,
        backlog: int = 128,
        limits: FrontLimits | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host, self._port, self._peers = host, port, peers
        self._limits = limits
        self.front: TlsFront | None = None
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The port listened on (the one bound, once started: 0 asks for a free one)."""
        return self._port

    async def start(self) -> None:
        await super().start()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.create_server(
            (self._host, self._port), family=family, backlog=self._backlog
        )
        listener.setblocking(False)
        self._listener, self._port = listener, int(listener.getsockname()[1])
        server = self._runner.server
        assert server is not None and self._ssl_context is not None
        loop = asyncio.get_running_loop()
        self.front = TlsFront(self._ssl_context, server, self._peers, loop, self._limits)
        self._accepting = asyncio.ensure_future(self.front.accept(listener))

    async def stop(self) -> None:
        if self.front is not None:
            self.front.stop()
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        await super().stop()

    async def wait_closed(self, grace: float = DRAIN_GRACE) -> bool:
        """After the app shut down: wait for the connections to finish (their last answers
        leave), then shut the stragglers; True if every thread ended in time."""
        front = self.front
        if front is None:
            return True
        if await asyncio.to_thread(front.join, grace):
            return True
        front.force_close()
        return await asyncio.to_thread(front.join, 5.0)
