"""One admitted upload request relayed to its upload server, on the connection's own thread.

``Relay(upstream_tls, config)(client, request, framing, target, origin)`` dials the PVC's
upload server over mutual TLS (a refused or reset dial is retried for ``dial_retry`` seconds:
the Service's endpoints lag the pod's Ready condition that ``readiness.py`` waited for), sends
the request head, says ``100 Continue`` if the uploader asked, copies the body with
``http1.relay_body`` on blocking sockets, and copies the upload server's status, headers and
body back unchanged. It answers whether the uploader's connection may be kept alive, or
raises the typed refusal the server answers with (502 unreachable, 408 interrupted).

Why it is shaped so:
- Blocking sockets, one thread per upload (``TlsStream``: large socket reads and writes,
  OpenSSL working with the GIL released), and the body moves through one reused buffer; on
  an event loop the same relay cost 1.4 times the CPU (see ``http1.py``). Uploads are few and
  long, so a thread each is cheap.
- No request timeout while bytes flow. Each receive from the uploader may wait up to
  ``idle_timeout`` seconds (the socket's timeout; the TLS state survives it, so the 408 can
  still be written); only time spent waiting for the uploader counts, never a slow upload
  server (backpressure: the proxy then waits in ``sendall``, which has no timeout). The
  answer may take up to ``response_timeout`` (a sync upload answers after conversion, T6);
  writing it to the uploader, ``write_timeout`` (a client that stops reading lets go).
- A body cut by the uploader is cut towards the upload server too (its socket is closed
  without a TLS close), so the server sees an incomplete upload, as it would directly.
- An upload server that answers before taking the whole body (busy, too large) and closes is
  answered with, not reported as unreachable.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from cdi.upload.errors import UploadInterrupted, UploadServerUnreachable
from cdi.upload.proxy import Admitted, ProxyConfig, answered, cors, forwarded
from wire.http1 import (
    NO_BODY,
    Framing,
    Head,
    HttpError,
    SinkFailed,
    SourceEnded,
    Wire,
    relay_body,
    response_framing,
)
from wire.tlsstream import TlsStream

log = logging.getLogger(__name__)

PIECE = 1 << 20  # the relay buffer; a TLS receive fills at most one record (16 KiB) of it
EARLY_ANSWER_WAIT = 5.0  # after a failed body write: how long to wait for the server's answer
_RETRIED = (
    ConnectionRefusedError,
    ConnectionResetError,
    ConnectionAbortedError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


def unreachable(detail: str) -> UploadServerUnreachable:
    log.warning("upload server unreachable: %s", detail)
    return UploadServerUnreachable(f"error in upload-proxy: http: proxy error: {detail}")


def _describe(err: OSError) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    return err.strerror or str(err) or type(err).__name__


def tune(sock: socket.socket) -> None:
    """Small heads go out at once (they are never followed by more of the same message)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Relay:
    """Dials upload servers with ``tls``. ``refresh`` (optional, blocking): re-read the
    credentials now and give a new context if they changed; asked when a server's certificate
    does not verify (a server CA switched before this process's periodic re-read), at most
    once per ``REFRESH_EVERY`` seconds whoever asks."""

    REFRESH_EVERY = 5.0

    def __init__(
        self,
        upstream_tls: ssl.SSLContext,
        config: ProxyConfig,
        refresh: Callable[[], ssl.SSLContext | None] | None = None,
    ) -> None:
        self.tls, self.config, self.refresh = upstream_tls, config, refresh
        self._refresh_lock = threading.Lock()
        self._refreshed_at = -math.inf

    def _refreshed(self, used: ssl.SSLContext) -> bool:
        """Whether a dial that failed with ``used`` may try again with newer credentials."""
        if self.refresh is None:
            return False
        with self._refresh_lock:
            if self.tls is not used:
                return True  # someone else refreshed meanwhile
            now = time.monotonic()
            if now - self._refreshed_at < self.REFRESH_EVERY:
                return False
            self._refreshed_at = now
            fresh = self.refresh()
            if fresh is None:
                return False
            self.tls = fresh
            log.info("the upload client credentials changed; dialling again with them")
            return True

    def dial(self, target: Admitted) -> TlsStream:
        url = urlsplit(target.url)
        host, port = url.hostname or "", url.port or 443
        give_up = time.monotonic() + self.config.dial_retry
        retried = False
        while True:
            used = self.tls
            try:
                return self._connect(host, port, target.server_hostname or host, used)
            except ssl.SSLCertVerificationError as exc:
                if not retried and self._refreshed(used):
                    retried = True
                    continue
                raise unreachable(f"tls: {exc.verify_message or exc}") from exc
            except _RETRIED as exc:
                if time.monotonic() >= give_up:
                    raise unreachable(f"dial tcp {host}:{port}: connect: {_describe(exc)}") from exc
            except (OSError, ssl.SSLError) as exc:
                raise unreachable(f"dial tcp {host}:{port}: connect: {_describe(exc)}") from exc
            time.sleep(self.config.dial_retry_interval)

    def _connect(self, host: str, port: int, hostname: str, tls: ssl.SSLContext) -> TlsStream:
        raw = socket.create_connection((host, port), timeout=self.config.connect_timeout)
        try:
            tune(raw)
            stream = TlsStream.connect(raw, tls, hostname)
        except BaseException:
            raw.close()
            raise
        raw.settimeout(None)
        return stream

    def __call__(
        self,
        client: Wire,
        request: Head,
        framing: Framing,
        target: Admitted,
        origin: str | None,
    ) -> bool:
        up = self.dial(target)
        try:
            return self._exchange(client, up, request, framing, target, origin)
        finally:
            up.close()

    def _exchange(
        self,
        client: Wire,
        up: TlsStream,
        request: Head,
        framing: Framing,
        target: Admitted,
        origin: str | None,
    ) -> bool:
        method = request.start[0]
        host = urlsplit(target.url).netloc
        headers = [("Host", host), *forwarded(request.headers)]
        if (framed := framing.header()) is not None:
            headers.append(framed)
        headers.append(("Connection", "close"))
        try:
            up.sendall(Head((method, target.path, "HTTP/1.1"), headers).encode())
        except (OSError, ssl.SSLError) as exc:
            raise unreachable(_describe(exc) if isinstance(exc, OSError) else str(exc)) from exc
        upstream = Wire(up)
        if framing is not NO_BODY and _expects_continue(request):
            client.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        complete = self._body(client, upstream, framing)
        answer = self._answer(upstream, method, complete)
        return self._respond(client, upstream, answer, method, origin, request, complete)

    def _body(self, client: Wire, upstream: Wire, framing: Framing) -> bool:
        """Copy the uploader's body; False if the upload server stopped taking it early."""
        sock = client.sock
        assert isinstance(sock, TlsStream)
        sock.widen()  # an admitted upload: large socket reads from here on
        sock.settimeout(self.config.idle_timeout)  # per receive: only waiting for the uploader
        try:
            relay_body(client, upstream.sock, framing, memoryview(bytearray(PIECE)))
            return True
        except SourceEnded as exc:
            if exc.idle:
                message = f"no upload data for {self.config.idle_timeout:g} seconds"
            else:
                message = f"the upload connection was cut: {exc}"
            raise UploadInterrupted(message) from exc
        except SinkFailed as exc:
            log.info("the upload server stopped taking the body: %s", exc)
            return False
        finally:
            sock.settimeout(self.config.write_timeout)  # the answer, to a client not reading

    def _answer(self, upstream: Wire, method: str, complete: bool) -> Head:
        """The upload server's final answer (informational ones skipped)."""
        sock = upstream.sock
        assert isinstance(sock, TlsStream)
        sock.settimeout(self.config.response_timeout if complete else EARLY_ANSWER_WAIT)
        try:
            while True:
                head = upstream.read_head()
                if head is None:
                    raise unreachable("EOF")
                code = head.start[1]
                if not (code.isascii() and code.isdigit()) or not 100 <= int(code) < 600:
                    raise unreachable(f"malformed HTTP status code {head.start[1]!r}")
                if not 100 <= int(head.start[1]) < 200:
                    return head
        except (OSError, ssl.SSLError, SourceEnded, HttpError) as exc:
            raise unreachable(str(exc) or type(exc).__name__) from exc

    def _respond(
        self,
        client: Wire,
        upstream: Wire,
        answer: Head,
        method: str,
        origin: str | None,
        request: Head,
        complete: bool,
    ) -> bool:
        try:
            framing = response_framing(answer, method)
        except HttpError as exc:
            raise unreachable(str(exc)) from exc
        headers = answered(answer.headers) + cors(origin)
        if framing is NO_BODY:
            headers += [(k, v) for k, v in answer.headers if k.lower() == "content-length"]
        elif (framed := framing.header()) is not None:
            headers.append(framed)
        keep = complete and framing.kind != "close" and keep_alive(request)
        if not keep:
            headers.append(("Connection", "close"))
        status = ("HTTP/1.1", answer.start[1], answer.start[2])
        try:
            client.sock.sendall(Head(status, headers).encode())
            relay_body(upstream, client.sock, framing, memoryview(bytearray(64 * 1024)))
        except (OSError, ssl.SSLError, SourceEnded, SinkFailed, HttpError) as exc:
            log.warning("relaying the upload server's answer failed: %s", exc)
            return False
        return keep


def _expects_continue(request: Head) -> bool:
    expect = request.get("Expect")
    return expect is not None and expect.lower() == "100-continue"


def keep_alive(request: Head) -> bool:
    """HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 closes it."""
    tokens = {t.strip().lower() for v in request.values("Connection") for t in v.split(",")}
    return request.start[2] == "HTTP/1.1" and "close" not in tokens
