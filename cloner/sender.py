"""One POST of the source's bytes to the target's upload server, over mutual TLS.

The upload server (``uploader/``) accepts a clone only from a client certificate whose CN names
this clone and that its client CA signed, and tells the stream's kind by CDI's header
``x-cdi-content-type`` (``blockdevice-clone-sparse``, ours, | ``filesystem-clone``). The body
is streamed (chunked, framed here), so memory stays at one piece whatever the volume's size;
the server answers only when the data is on the target. Nothing is retried here: the stream
cannot be replayed cheaply, and the controller's failure policy restarts the pod.

The bytes go over ``TlsStream`` (``wire/tlsstream.py``, the upload proxy's): records
are made in memory and written about ``FLUSH_AT`` at a time, where ``http.client`` over
``wrap_socket`` made one write system call per 16 KiB record (on loopback each also runs the
receiver's TCP stack). ``http.client`` still parses the answer.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast
from urllib.parse import SplitResult, urlsplit

from cdi.api.errors import SourceUnavailable, TargetError
from cloner.config import CloneConfig
from cloner.reader import Payload
from wire.tlsstream import TlsStream

CLONE_HEADER = "x-cdi-content-type"
TIMEOUT = 300.0  # per socket operation: the server may flush a big tail before answering
FLUSH_AT = 256 * 1024  # encrypted bytes gathered in memory before one socket write


@dataclass(frozen=True)
class Sent:
    bytes_sent: int
    status: int


def tls_context(config: CloneConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.server_ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.client_cert, config.client_key)
    return ctx


def connect(host: str, port: int, ctx: ssl.SSLContext, server_name: str) -> TlsStream:
    """Dials ``host`` but verifies (and sends SNI for) ``server_name``: the Service's ClusterIP
    reaches the server, its certificate names ``cdi-upload-<pvc>.<ns>.svc``."""
    sock = socket.create_connection((host, port), timeout=TIMEOUT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return TlsStream.connect(sock, ctx, server_name)
    except BaseException:
        sock.close()
        raise


SMALL = 64 * 1024  # pieces below this (frame headers, tar headers) are joined, not sent alone


def _counted(
    pieces: Iterator[bytes | memoryview], count: list[int]
) -> Iterator[bytes | memoryview]:
    for piece in pieces:
        count[0] += len(piece)
        yield piece


def _chunked(pieces: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    """``Transfer-Encoding: chunked`` framing with few pieces: a big piece goes as it is (no
    copy: joining size, piece and CRLF would copy every 4 MiB piece), the small pieces before
    it (headers) joined with its size line and the previous chunk's CRLF into one piece. Every
    piece is at least one TLS record, so a 16-byte frame header alone costs a record."""
    small: list[bytes | memoryview] = []
    held, tail = 0, b""
    for piece in pieces:
        n = len(piece)
        if not n:
            continue
        if n < SMALL:
            small.append(piece)
            held += n
            if held >= SMALL:
                yield b"".join([tail, b"%X\r\n" % held, *small])
                small, held, tail = [], 0, b"\r\n"
            continue
        yield b"".join([tail, b"%X\r\n" % (held + n), *small])
        yield piece
        small, held, tail = [], 0, b"\r\n"
    if held:
        yield b"".join([tail, b"%X\r\n" % held, *small])
        tail = b"\r\n"
    yield tail + b"0\r\n\r\n"


def _head(url: SplitResult, headers: dict[str, str]) -> bytes:
    host = url.netloc.rpartition("@")[2]
    lines = [f"POST {url.path or '/'} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _write_all(stream: TlsStream, head: bytes, body: Iterator[bytes | memoryview]) -> None:
    """The head and body encrypted into memory and written in pieces of about ``FLUSH_AT``:
    a 4 MiB chunk is one write, not 256 (one per 16 KiB record, as ``wrap_socket`` does)."""
    stream.write(head)
    for piece in body:
        view = memoryview(piece)
        for at in range(0, len(view), FLUSH_AT):
            stream.write(view[at : at + FLUSH_AT])
            if stream.outgoing.pending >= FLUSH_AT:
                stream.flush()
    stream.flush()


class _Plaintext(io.RawIOBase):
    """The response side of the stream as a file, for ``http.client``'s response parser."""

    def __init__(self, stream: TlsStream) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        return self.stream.recv_into(memoryview(buffer).cast("B"))


class _ResponseSocket:
    def __init__(self, stream: TlsStream) -> None:
        self.stream = stream

    def makefile(self, mode: str, *_: object, **__: object) -> io.BufferedReader:
        return io.BufferedReader(_Plaintext(self.stream))


def _response(stream: TlsStream) -> tuple[int, str]:
    response = http.client.HTTPResponse(cast(socket.socket, _ResponseSocket(stream)), method="POST")
    response.begin()
    return response.status, response.read(4096).decode(errors="replace").strip()


def send(config: CloneConfig, payload: Payload) -> Sent:
    url = urlsplit(config.upload_url)
    host = url.hostname or ""
    headers = {CLONE_HEADER: str(payload.content_type), "Content-Type": "application/octet-stream"}
    chunked = payload.length is None
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
    else:
        headers["Content-Length"] = str(payload.length)
    count = [0]
    counted = _counted(payload.pieces, count)
    body = _chunked(counted) if chunked else counted
    try:
        ctx = tls_context(config)
        with connect(host, url.port or 443, ctx, config.server_name or host) as stream:
            _write_all(stream, _head(url, headers), body)
            status, text = _response(stream)
    except (OSError, http.client.HTTPException) as exc:
        raise SourceUnavailable(f"sending to the clone target failed: {exc}") from exc
    if status // 100 != 2:
        raise TargetError(
            f"the clone target answered {status}: {text[:200]}",
            transient=status >= 500,  # a refusal (4xx) will not change on retry
        )
    return Sent(count[0], status)
