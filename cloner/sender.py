"""One POST of the source's bytes to the target's upload server, over mutual TLS.

The upload server (``uploader/``) accepts a clone only from a client certificate whose CN names
this clone and that its client CA signed, and tells the stream's kind by CDI's header
``x-cdi-content-type`` (``blockdevice-clone-sparse``, ours, | ``filesystem-clone``). The body
is streamed with ``http.client`` (chunked, framed here), so memory stays at one piece
whatever the volume's size; the server answers only when the data is on the target. Nothing is
retried here: the stream cannot be replayed cheaply, and the controller's failure policy
restarts the pod.
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from cdi.api.errors import SourceUnavailable, TargetError
from cloner.config import CloneConfig
from cloner.reader import Payload

CLONE_HEADER = "x-cdi-content-type"
TIMEOUT = 300.0  # per socket operation: the server may flush a big tail before answering


@dataclass(frozen=True)
class Sent:
    bytes_sent: int
    status: int


def tls_context(config: CloneConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.server_ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.client_cert, config.client_key)
    return ctx


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """Dials ``host`` but verifies (and sends SNI for) ``server_name``: the Service's ClusterIP
    reaches the server, its certificate names ``cdi-upload-<pvc>.<ns>.svc``."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, server_name: str) -> None:
        super().__init__(host, port, context=context, timeout=TIMEOUT)
        self._tls, self._server_name = context, server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


SMALL = 64 * 1024  # pieces below this (frame headers, tar headers) are joined, not sent alone


def _counted(
    pieces: Iterator[bytes | memoryview], count: list[int]
) -> Iterator[bytes | memoryview]:
    for piece in pieces:
        count[0] += len(piece)
        yield piece


def _chunked(pieces: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    """``Transfer-Encoding: chunked`` framing with few writes: a big piece goes as it is (no
    copy: ``http.client``'s own framing concatenates size, piece and CRLF, a copy of every
    4 MiB piece, once the sender's largest CPU cost), the small pieces before it (headers)
    joined with its size line and the previous chunk's CRLF into one write. Every write is a
    TLS record and a system call, so a 16-byte frame header sent alone costs as much as that."""
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


def send(config: CloneConfig, payload: Payload) -> Sent:
    url = urlsplit(config.upload_url)
    host = url.hostname or ""
    conn = _NamedHTTPSConnection(
        host, url.port or 443, tls_context(config), config.server_name or host
    )
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
        conn.request("POST", url.path or "/", body=body, headers=headers)
        response = conn.getresponse()
        text = response.read(4096).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException) as exc:
        raise SourceUnavailable(f"sending to the clone target failed: {exc}") from exc
    finally:
        conn.close()
    if response.status // 100 != 2:
        raise TargetError(
            f"the clone target answered {response.status}: {text[:200]}",
            transient=response.status >= 500,  # a refusal (4xx) will not change on retry
        )
    return Sent(count[0], response.status)
