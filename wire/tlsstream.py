"""A blocking TLS connection that moves its records through memory BIOs, in large socket I/O.

``TlsStream.accept(sock, ctx)`` (server side) and ``TlsStream.connect(sock, ctx, hostname)``
(client side, verifying the peer) do the handshake on a blocking socket; then
``recv_into`` / ``sendall`` read and write plaintext like a socket's.

Why not ``SSLContext.wrap_socket``: OpenSSL's socket BIO (without read-ahead, which Python
cannot switch on) reads every TLS record with two ``read`` calls (its 5-byte header, then the
rest) and writes every record with its own ``write``: a 16 KiB record costs three system calls
on the way through the proxy, and on loopback each call also runs the TCP stack of the other
end. Here the socket is read in pieces of up to ``RECEIVE`` bytes into one reused buffer,
handed to OpenSSL in memory, and ``recv_into`` returns as many decrypted records as that
delivered (not one record), so the relay's ``sendall`` encrypts them all into memory and
writes them with one call. The price is one memory copy each way, which costs less than
the calls it saves. OpenSSL still encrypts and decrypts with the GIL released.

Memory: until ``widen`` is called the stream reads the socket in pieces of ``SMALL``
(one TLS record and its header), so a connection that has not proven anything yet (a
handshake, a request head) costs a few KiB, not ``RECEIVE`` (security review 3, N3): the
owner widens it for an admitted upload (the proxy) or an authenticated peer (the upload
server's front).

A sender with many small pieces (frame headers before a large chunk) may ``write`` them into
memory and ``flush`` once: one socket write for all their records.

One thread may receive while another sends (the upload server's TLS front is full duplex):
every call into the TLS object holds ``_tls_lock`` (OpenSSL's objects are not safe for
concurrent use) and socket writes hold ``_send_lock``, so records leave in the order they
were made. Socket reads and writes happen outside ``_tls_lock``: a send blocked on a slow
peer never stops the receiving thread.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from typing import cast

RECEIVE = 256 * 1024
SMALL = 16 * 1024 + 256 + 5  # the largest TLS record and its header


class TlsStream:
    def __init__(
        self, sock: socket.socket, ctx: ssl.SSLContext, server_side: bool, hostname: str | None
    ) -> None:
        self.raw = sock  # the TCP socket: timeouts and shutdown apply to it
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_side, hostname)
        self.buffer = memoryview(bytearray(SMALL))
        self.ended = False
        self._tls_lock = threading.Lock()
        self._send_lock = threading.Lock()

    @classmethod
    def accept(cls, sock: socket.socket, ctx: ssl.SSLContext) -> TlsStream:
        stream = cls(sock, ctx, True, None)
        stream.handshake()
        return stream

    @classmethod
    def connect(cls, sock: socket.socket, ctx: ssl.SSLContext, hostname: str) -> TlsStream:
        stream = cls(sock, ctx, False, hostname)
        stream.handshake()
        return stream

    def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                with contextlib.suppress(OSError):
                    self._flush()  # the alert that says why
                raise
            self._flush()
            if not self._receive():
                raise ssl.SSLEOFError("the peer closed the connection during the handshake")
        self._flush()

    def widen(self, size: int = RECEIVE) -> None:
        """Read the socket in pieces of ``size`` from now on (the large socket reads that
        make this stream fast); call it once the peer is trusted with that much memory."""
        if len(self.buffer) < size:
            self.buffer = memoryview(bytearray(size))

    def _flush(self) -> None:
        with self._send_lock:
            with self._tls_lock:
                data = self.outgoing.read() if self.outgoing.pending else b""
            if data:
                self.raw.sendall(data)

    def flush(self) -> None:
        """Send the records ``write`` made."""
        self._flush()

    def _receive(self) -> bool:
        """One socket read into OpenSSL's input; False at the end of the stream."""
        n = self.raw.recv_into(self.buffer)
        with self._tls_lock:
            if not n:
                self.incoming.write_eof()
                self.ended = True
                return False
            self.incoming.write(self.buffer[:n])
        return True

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        """Plaintext into ``buffer``: at least one byte (waiting for it), then whatever more
        is already received, up to ``nbytes``; 0 at the end of the stream."""
        want = nbytes or len(buffer)
        got = 0
        lock, read = self._tls_lock, self.tls.read
        while got < want:
            try:
                with lock:
                    # with a buffer, read() answers a count (typeshed says bytes)
                    got += cast(int, read(want - got, buffer[got:want]))  # type: ignore[arg-type]
                    more = self.incoming.pending or self.tls.pending()
            except ssl.SSLWantReadError:
                if got:
                    return got
                if self.outgoing.pending:  # a TLS 1.3 key update or ticket to answer
                    self._flush()
                if self.ended or not self._receive():
                    return 0
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return got
            else:
                if not more:
                    return got
        return got

    def write(self, data: bytes | memoryview) -> None:
        """Encrypt ``data`` into memory (all of it, as records); ``flush`` sends them."""
        with self._tls_lock:
            self.tls.write(data)

    def sendall(self, data: bytes | memoryview) -> None:
        with self._send_lock:
            with self._tls_lock:
                self.tls.write(data)  # into memory: all of it, as records
                out = self.outgoing.read()
            self.raw.sendall(out)

    def close_notify(self) -> None:
        """Tell the peer the stream ends (TLS ``close_notify``), best effort: the peer may be
        gone already."""
        with contextlib.suppress(OSError, ssl.SSLError):
            with self._tls_lock:
                with contextlib.suppress(ssl.SSLWantReadError):
                    self.tls.unwrap()
            self._flush()

    def settimeout(self, seconds: float | None) -> None:
        self.raw.settimeout(seconds)

    def getpeercert(self) -> dict[str, object] | None:
        return self.tls.getpeercert()  # type: ignore[return-value]

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> TlsStream:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
