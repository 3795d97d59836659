"""The upload server's TLS door: asyncio's own TLS, with the limits of security review 3 (N4).

The app (aiohttp) is served on asyncio's TLS transport; Python 3.11's ``sslproto`` reads up to
256 KiB of plaintext per call, so the body reaches the data path in large pieces. The CN the
app checks (401 without the right one) is the verified client certificate's, read from the
connection's transport (``peercert``), never from anything the client sends.

Why no TLS on threads any more: a front that did the handshake and the decryption on threads
and handed the app plaintext over a socket pair (this module until 5 Dec 2026) was re-measured
on an idle machine, alternating (issue 25, ``docs/upload.md``): it cost more than it saved
(qcow2 upload 1.27 s against 0.97 s here, through the proxy 1.85 s against 1.56 s, the
receiver of a filesystem clone 1.34 against 1.25 CPU s).

What anyone who reaches the pod can hold (security review 3, N4), ``FrontLimits``:

- the TLS layer requires a client certificate from the client CA (``CERT_REQUIRED`` in the
  context): a client without one fails the handshake, and nothing of the app is spent on it;
- a handshake has ``handshake_timeout`` seconds in total (asyncio's ``ssl_handshake_timeout``
  is a total, and ``wait_for`` bounds it again: trickled bytes do not extend it) and one of
  ``max_handshakes`` slots, at most ``handshakes_per_address`` per client address (more are
  closed at accept, before any TLS state exists);
- only a verified client meets the app, and only in one of ``max_connections`` connection
  slots (reading paused while it waits, up to ``HAND_OVER_TIMEOUT``); its first request head
  must be through within ``head_timeout`` seconds of being admitted, else the connection is
  aborted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from wire.connlimit import AddressSlots

log = logging.getLogger("uploader")

HAND_OVER_TIMEOUT = 30.0  # seconds a verified client waits for a connection slot
HEAD_END = b"\r\n\r\n"
ProtocolFactory = Callable[[], asyncio.Protocol]


@dataclass(frozen=True)
class FrontLimits:
    handshake_timeout: float = 10.0  # in total, from accept
    head_timeout: float = 30.0  # in total, from admission to the end of the first head
    max_handshakes: int = 128
    handshakes_per_address: int = 8  # the proxy and a clone source use one or two at a time
    max_connections: int = 64  # verified clients


def common_name(cert: Any) -> str | None:
    """The subject CN of a certificate as ``getpeercert()`` answers it (None without one)."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class Slots:
    """``total`` slots on the event loop: ``take`` now or ``wait`` in arrival order."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self) -> bool:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot just as the wait was given up
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


class Door(asyncio.Protocol):
    """The app's protocol behind the door: it meets a verified connection only once a
    connection slot is free, and loses it if the first request head is late."""

    def __init__(self, app: asyncio.Protocol, front: TlsFront) -> None:
        self.app, self.front = app, front
        self.transport: asyncio.Transport | None = None
        self.admitted = self.head_seen = False
        self._tail = b""  # the last bytes seen: the head's end may straddle two pieces
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.front.closing:
            transport.abort()
        elif self.front.connections.take():
            self._admit()
        else:
            transport.pause_reading()
            self.front.waiting.add(self)
            self._waiting = asyncio.ensure_future(self._wait_for_slot())

    async def _wait_for_slot(self) -> None:
        assert self.transport is not None
        try:
            await asyncio.wait_for(self.front.connections.wait(), HAND_OVER_TIMEOUT)
        except TimeoutError:
            log.info("no connection slot came free for a verified client; closing it")
            self.transport.abort()
            return
        finally:
            self.front.waiting.discard(self)
        if self.transport.is_closing() or self.front.closing:
            self.front.connections.give()
            self.transport.abort()
            return
        self._admit()
        self.transport.resume_reading()

    def _admit(self) -> None:
        assert self.transport is not None
        self.admitted = True
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.front.limits.head_timeout, self._head_late)
        self.app.connection_made(self.transport)

    def _head_late(self) -> None:
        if not self.head_seen and self.transport is not None:
            log.info("a client's first request head was not through in time; closing it")
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.head_seen:
            if HEAD_END in data or HEAD_END in self._tail + data[: len(HEAD_END) - 1]:
                self.head_seen = True
                if self._timer is not None:
                    self._timer.cancel()
            self._tail = data[-(len(HEAD_END) - 1) :]
        self.app.data_received(data)

    def eof_received(self) -> bool | None:
        return self.app.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.app.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._waiting is not None:
            self._waiting.cancel()
        if self.admitted:
            self.admitted = False
            self.front.connections.give()
            self.app.connection_lost(exc)


class TlsFront:
    """Accepts on a listening socket; each connection's handshake under the limits."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        app: ProtocolFactory,
        loop: asyncio.AbstractEventLoop,
        limits: FrontLimits | None = None,
    ) -> None:
        self.ctx, self.app, self.loop = ctx, app, loop
        self.limits = limits = limits or FrontLimits()
        self.handshakes = AddressSlots(limits.max_handshakes, limits.handshakes_per_address)
        self.connections = Slots(limits.max_connections)
        self.handshaking: set[asyncio.Task[None]] = set()
        self.waiting: set[Door] = set()
        self.closing = False

    async def accept(self, listener: socket.socket) -> None:
        """Accept until cancelled; each connection's handshake is a task of its own."""
        while True:
            try:
                client, peer = await self.loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and the like: the next accept may succeed
                log.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            address = str(peer[0])
            if self.closing or not self.handshakes.take(address):
                client.close()
                continue
            task = asyncio.ensure_future(self._handshake(client, address))
            self.handshaking.add(task)
            task.add_done_callback(self.handshaking.discard)

    async def _handshake(self, client: socket.socket, address: str) -> None:
        """The TLS handshake, the client's certificate verified (``CERT_REQUIRED``); the
        connection then belongs to its ``Door``."""
        timeout = self.limits.handshake_timeout
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.wait_for(
                self.loop.connect_accepted_socket(
                    lambda: Door(self.app(), self), client, ssl=self.ctx,
                    ssl_handshake_timeout=timeout,
                ),
                timeout + 1.0,
            )  # fmt: skip
        except (OSError, ssl.SSLError, ValueError, TimeoutError, asyncio.CancelledError) as exc:
            log.debug("TLS handshake failed: %s", exc or type(exc).__name__)
            client.close()  # asyncio closed its transport; the socket object too, in case
        finally:
            self.handshakes.give(address)

    def stop(self) -> None:
        """No more connections for the app: handshakes under way and clients still waiting
        for a slot are dropped (admitted ones end with the app's shutdown)."""
        self.closing = True
        for task in list(self.handshaking):
            task.cancel()
        for door in list(self.waiting):
            if door.transport is not None:
                door.transport.abort()


class TlsFrontSite(web.BaseSite):
    """An aiohttp site served through ``TlsFront``: ``runner.cleanup()`` stops it like a
    ``TCPSite``; ``wait_closed`` then waits for dropped handshakes to finish."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        *,
        backlog: int = 128,
        limits: FrontLimits | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host, self._port = host, port
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
        self.front = TlsFront(self._ssl_context, server, loop, self._limits)
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

    async def wait_closed(self, grace: float = 10.0) -> bool:
        """After the app shut down: wait for the dropped handshakes' tasks; True if they
        ended within ``grace`` seconds."""
        front = self.front
        if front is None or not front.handshaking:
            return True
        _, pending = await asyncio.wait(list(front.handshaking), timeout=grace)
        return not pending
