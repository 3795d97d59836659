"""HTTP/1.1 on blocking sockets, just what the upload proxy's relay needs: message heads, body
framing, and a body copied from one socket to another without being re-joined.

Why not aiohttp (or another event-loop HTTP stack) for the relay: on an event loop every byte
of a TLS upload is copied into and out of asyncio's in-memory TLS buffers and every piece
costs a few Python callbacks; the proxy spent more CPU per upload than the upload server that
converts it. On a blocking TLS stream (``tlsstream.py``) OpenSSL works in C with the GIL
released, and the body is moved by ``recv_into`` into one reused buffer and ``sendall`` of a
``memoryview`` of it: no allocation and no Python-level copy per piece. Backpressure comes
by construction: the next piece is read only once the previous one was written. Timeouts are
the sockets' own (a receive that waits too long raises ``TimeoutError``: ``SourceEnded.idle``).

Shapes:
- ``Wire`` is a socket with a read-ahead buffer: a head is read in large receives, and the
  bytes received past it are the start of the body.
- ``Head`` is a start line and headers; ``Framing`` says how long the body after it is
  (CDI's clients send ``Content-Length``; aiohttp's streamed bodies and browsers may send
  ``Transfer-Encoding: chunked``, which is passed through unchanged, chunk by chunk).
- ``relay_body`` copies one body; a failure says which side failed (``SourceEnded``: the
  sender stopped early, ``SinkFailed``: the receiver would not take more), because the proxy
  answers the two differently.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Protocol

MAX_HEAD = 64 * 1024  # bytes of request line and headers (aiohttp's and Go's limits are near)
MAX_HEADERS = 128
# A head is read in pieces of this; the piece is allocated before the receive waits, so a
# client that trickles its head holds one (N3): about one TLS record, not more.
_RECV = 16 * 1024
CRLF = b"\r\n"
_HEXDIGITS = b"0123456789abcdefABCDEF"


class Socketish(Protocol):
    """What the relay needs of a (TLS) socket."""

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int: ...

    def sendall(self, data: bytes | memoryview) -> None: ...


class HttpError(Exception):
    """A malformed or unsupported message; ``status`` is what the proxy answers (then closes)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SourceEnded(Exception):
    """The side the body comes from ended it early: cut, reset, or ``idle`` (its socket's
    timeout passed without a byte)."""

    def __init__(self, message: str, idle: bool = False) -> None:
        super().__init__(message)
        self.idle = idle


class SinkFailed(Exception):
    """The side the body goes to failed to take it (closed, reset)."""


@dataclass
class Head:
    """A request line (method, target, version) or status line (version, status, reason),
    and the headers in their order."""

    start: tuple[str, str, str]
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]

    def encode(self) -> bytes:
        lines = [" ".join(self.start)] + [f"{k}: {v}" for k, v in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(frozen=True)
class Framing:
    """How the body after a head ends: ``none``, ``length`` bytes, ``chunked``, or at
    ``close`` of the connection (a response without a length)."""

    kind: str
    length: int = 0

    def header(self) -> tuple[str, str] | None:
        if self.kind == "length":
            return ("Content-Length", str(self.length))
        if self.kind == "chunked":
            return ("Transfer-Encoding", "chunked")
        return None


NO_BODY = Framing("none")


def _length(head: Head) -> int | None:
    found = {v.strip() for value in head.values("Content-Length") for v in value.split(",")}
    if not found:
        return None
    # ASCII digits only: str.isdigit() also takes "¹²³", which int() then refuses
    if len(found) > 1 or not all(v.isascii() and v.isdigit() for v in found):
        raise HttpError("invalid Content-Length")
    return int(found.pop())


def _chunked(head: Head) -> bool:
    codings = [c.strip().lower() for v in head.values("Transfer-Encoding") for c in v.split(",")]
    if not codings:
        return False
    if codings != ["chunked"]:
        raise HttpError(f"unsupported Transfer-Encoding {', '.join(codings)}", 501)
    return True


def request_framing(head: Head) -> Framing:
    """RFC 9112 section 6: chunked, or Content-Length, or no body; both at once is refused
    (the request smuggling case)."""
    chunked, length = _chunked(head), _length(head)
    if chunked and length is not None:
        raise HttpError("both Transfer-Encoding and Content-Length")
    if chunked:
        return Framing("chunked")
    return Framing("length", length) if length else NO_BODY


def response_framing(head: Head, method: str) -> Framing:
    status = int(head.start[1])
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return NO_BODY
    if _chunked(head):
        return Framing("chunked")
    length = _length(head)
    return Framing("close") if length is None else Framing("length", length)


def _parse(raw: bytes) -> Head:
    lines = raw.decode("latin-1").split("\r\n")
    if any(c in line for line in lines for c in "\r\n\x00"):
        raise HttpError("bare CR, LF or NUL in the message head")  # could split a header later
    start = lines[0].split(" ", 2)
    if len(start) < 2 or any(not part for part in start[:2]):
        raise HttpError("malformed start line")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError("too many headers", 431)
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or any(c in name for c in " \t"):
            raise HttpError("malformed header line")
        headers.append((name, value.strip()))
    return Head((start[0], start[1], start[2] if len(start) > 2 else ""), headers)


class Wire:
    """A socket and the bytes read from it but not yet used (past a head, a chunk line)."""

    def __init__(self, sock: Socketish) -> None:
        self.sock = sock
        self.ahead = bytearray()

    def _fill(self) -> int:
        chunk = bytearray(_RECV)
        n = self.sock.recv_into(memoryview(chunk), _RECV)
        self.ahead += memoryview(chunk)[:n]
        return n

    def read_head(self) -> Head | None:
        """The next head; None if the connection ended cleanly before its first byte."""
        while True:
            end = self.ahead.find(b"\r\n\r\n")
            if end >= 0:
                raw = bytes(self.ahead[:end])
                del self.ahead[: end + 4]
                return _parse(raw.lstrip(CRLF))
            if len(self.ahead) > MAX_HEAD:
                raise HttpError("request head too large", 431)
            if not self._fill():
                if self.ahead.strip():
                    raise SourceEnded("the connection ended inside a message head")
                return None

    def read_line(self, limit: int = 4096) -> bytes:
        while (end := self.ahead.find(CRLF)) < 0:
            if len(self.ahead) > limit:
                raise HttpError("chunk line too long")
            if not self._fill():
                raise SourceEnded("the connection ended inside the body")
        line = bytes(self.ahead[:end])
        del self.ahead[: end + 2]
        return line

    def recv_into(self, buf: memoryview) -> int:
        if self.ahead:
            n = min(len(buf), len(self.ahead))
            buf[:n] = self.ahead[:n]
            del self.ahead[:n]
            return n
        return self.sock.recv_into(buf, len(buf))


def _source_error(exc: BaseException) -> SourceEnded:
    return SourceEnded(str(exc) or type(exc).__name__, idle=isinstance(exc, TimeoutError))


def copy_exactly(src: Wire, dst: Socketish, left: int, buf: memoryview) -> int:
    """Copy ``left`` bytes: the hot loop of an upload."""
    size, done = len(buf), 0
    receive, send = src.recv_into, dst.sendall
    while left:
        try:
            n = receive(buf[: min(left, size)])
        except (OSError, ssl.SSLError) as exc:
            raise _source_error(exc) from exc
        if not n:
            raise SourceEnded(f"the body ended after {done} of {done + left} bytes")
        try:
            send(buf[:n])
        except (OSError, ssl.SSLError) as exc:
            raise SinkFailed(str(exc) or type(exc).__name__) from exc
        left -= n
        done += n
    return done


def _send(dst: Socketish, data: bytes) -> None:
    try:
        dst.sendall(data)
    except (OSError, ssl.SSLError) as exc:
        raise SinkFailed(str(exc) or type(exc).__name__) from exc


def _line(src: Wire) -> bytes:
    try:
        return src.read_line()
    except (OSError, ssl.SSLError) as exc:
        raise _source_error(exc) from exc


def copy_chunked(src: Wire, dst: Socketish, buf: memoryview) -> int:
    """Pass a chunked body through unchanged: each size line, its data, the trailers."""
    done = 0
    while True:
        line = _line(src)
        digits = line.split(b";", 1)[0].strip()
        # RFC 9112: 1*HEXDIG; int(..., 16) alone also takes "0x5", "+5" and "1_0", which the
        # upload server, reading the same line we pass on, may read otherwise
        if not digits or digits.translate(None, _HEXDIGITS):
            raise HttpError("malformed chunk size")
        size = int(digits, 16)
        _send(dst, line + CRLF)
        if size == 0:
            while trailer := _line(src):
                _send(dst, trailer + CRLF)
            _send(dst, CRLF)
            return done
        done += copy_exactly(src, dst, size, buf)
        if _line(src):
            raise HttpError("chunk data longer than its size")
        _send(dst, CRLF)


def copy_until_close(src: Wire, dst: Socketish, buf: memoryview) -> int:
    done = 0
    while True:
        try:
            n = src.recv_into(buf)
        except (OSError, ssl.SSLError) as exc:
            raise _source_error(exc) from exc
        if not n:
            return done
        try:
            dst.sendall(buf[:n])
        except (OSError, ssl.SSLError) as exc:
            raise SinkFailed(str(exc) or type(exc).__name__) from exc
        done += n


def relay_body(src: Wire, dst: Socketish, framing: Framing, buf: memoryview) -> int:
    """Copy the body ``framing`` describes from ``src`` to ``dst``; the number of bytes."""
    if framing.kind == "length":
        return copy_exactly(src, dst, framing.length, buf)
    if framing.kind == "chunked":
        return copy_chunked(src, dst, buf)
    if framing.kind == "close":
        return copy_until_close(src, dst, buf)
    return 0
