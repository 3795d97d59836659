"""Slow clients for the connection-holding tests (security review 3, N3 and N4): real TCP
connections from chosen loopback source addresses that trickle a TLS ClientHello, or finish
the handshake (without a client certificate) and trickle a request head, one byte per
``interval``; a connection the server ends is opened again (``reconnect``), as an attacker
would. One thread drives them all; it records how long each connection the server ended
had lived."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

HEAD = b"POST /v1beta1/upload HTTP/1.1\r\nHost: victim\r\nX-Pad: "


def client_hello() -> bytes:
    """The first flight of a real TLS client: what a handshake trickler sends, byte by byte."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="victim")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@dataclass
class _Conn:
    sock: socket.socket
    opened: float
    sent: int = 0


@dataclass
class SlowClients:
    """``count`` connections to ``127.0.0.1:port``, spread over ``sources``; ``kind`` is
    ``"handshake"`` (trickle a ClientHello) or ``"head"`` (handshake with ``tls``, then
    trickle ``HEAD`` and pad bytes)."""

    port: int
    sources: list[str]
    count: int
    kind: str = "handshake"
    tls: ssl.SSLContext | None = None
    interval: float = 0.5
    reconnect: bool = True
    pad: int = 0  # head bytes sent at once before the trickle (memory per connection)
    lifetimes: list[float] = field(default_factory=list)  # of connections the server ended
    _conns: list[_Conn | None] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.hello = client_hello()
        self._conns = [None] * self.count

    @property
    def open(self) -> int:
        return sum(c is not None for c in self._conns)

    def __enter__(self) -> SlowClients:
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for conn in self._conns:
            if conn is not None:
                conn.sock.close()

    def wait_open(self, at_least: int, seconds: float = 60) -> int:
        deadline = time.monotonic() + seconds
        while self.open < at_least and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.open

    def wait_all_ended(self, seconds: float) -> int:
        """Wait until the server ended every connection (without ``reconnect``); how many
        are still open."""
        deadline = time.monotonic() + seconds
        while self.open and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.open

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            started = time.monotonic()
            for i in range(self.count):
                if self._stop.is_set():
                    return
                conn = self._conns[i]
                if conn is None and (first or self.reconnect):
                    self._conns[i] = self._open(self.sources[i % len(self.sources)])
                elif conn is not None and not self._trickle(conn):
                    self.lifetimes.append(time.monotonic() - conn.opened)
                    conn.sock.close()
                    self._conns[i] = None
            first = False
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _open(self, source: str) -> _Conn | None:
        try:
            raw = socket.create_connection(
                ("127.0.0.1", self.port), timeout=5, source_address=(source, 0)
            )
        except OSError:
            return None
        opened = time.monotonic()
        try:
            if self.kind == "head":
                assert self.tls is not None
                sock: socket.socket = self.tls.wrap_socket(raw, server_hostname="127.0.0.1")
                sock.sendall(HEAD + b"a" * self.pad)
            else:
                sock = raw
        except (OSError, ssl.SSLError):
            raw.close()
            return None
        return _Conn(sock, opened)

    def _trickle(self, conn: _Conn) -> bool:
        """One more byte; False once the server has ended the connection."""
        if _ended(conn.sock):
            return False
        if self.kind == "head":
            byte = b"a"
        else:
            byte = self.hello[conn.sent % len(self.hello) : conn.sent % len(self.hello) + 1]
        try:
            conn.sock.sendall(byte)
        except (OSError, ssl.SSLError):
            return False
        conn.sent += 1
        return True


def _ended(sock: socket.socket) -> bool:
    """Whether the server closed (or reset) the connection: readable with nothing to read."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        sock.setblocking(False)
        data = sock.recv(4096)
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except (OSError, ssl.SSLError):
        return True
    finally:
        sock.settimeout(5)
    return not data
