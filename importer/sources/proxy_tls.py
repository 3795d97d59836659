"""A connection through an ``https://`` import proxy: TLS to the proxy, then the request.

CDIConfig ``importProxy`` may name proxies that listen with TLS (``https://proxy:3129``), whose
certificate a private CA signed: ``importProxy.trustedCAProxy`` names the ConfigMap holding it,
which the controller copies beside each import and mounts at ``/proxycerts/``
(``IMPORTER_PROXY_CERT_DIR``, CDI's names). Through such a proxy:

- an ``http://`` URL is one TLS connection to the proxy carrying absolute-form requests;
- an ``https://`` URL is a CONNECT tunnel inside that TLS connection, and the destination's
  own TLS inside the tunnel: TLS in TLS. ``ssl.SSLContext.wrap_socket`` cannot wrap an
  ``SSLSocket`` (it would take over the file descriptor and talk past the outer TLS), so the
  inner TLS runs through memory BIOs over the outer socket (``wire.tlsstream.TlsStream``) and
  ``TunnelSocket`` gives ``http.client`` the socket face it needs.

The proxy is always verified, with the system's CAs plus the trustedCAProxy bundle: a DataVolume's
``insecureSkipVerify`` is about its own source, never about the operator's proxy. An untrusted
proxy certificate is a permanent ``SourceUnavailable`` that names the proxy and the setting that
fixes it; it is not the destination's certificate, so the certConfigMap advice would mislead.

Both kinds of proxy open their CONNECT tunnels with ``TypedTunnel``: ``http.client`` reports a
refused CONNECT as an ``OSError`` whose only trace of the status is its text, and a 407 (the
proxy refused the credentials) must become a permanent ``ProxyAuthenticationFailed`` without
reading an error message; ``TunnelRefused`` carries the status.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import threading

from cdi.api.errors import SourceUnavailable
from cdi.api.redact import redact_url
from wire.tlsstream import TlsStream

_MAX_LINE = 65536


class TunnelRefused(OSError):
    """The proxy answered a CONNECT with ``status`` (not 200). An ``OSError``, as
    ``http.client``'s own, so every status but 407 stays a transient connection failure."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"Tunnel connection failed: {status} {text}")
        self.status = status


class TypedTunnel(http.client.HTTPConnection):
    """``http.client``'s CONNECT exchange (same request, same header skipping), raising
    ``TunnelRefused`` with the status instead of an untyped ``OSError``."""

    def _tunnel(self) -> None:
        host = str(self._tunnel_host)  # type: ignore[attr-defined]
        port = int(self._tunnel_port)  # type: ignore[attr-defined]
        lines = [f"CONNECT {host}:{port} HTTP/1.0\r\n".encode("ascii")]
        headers = self._tunnel_headers.items()  # type: ignore[attr-defined]
        lines += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers]
        self.send(b"".join([*lines, b"\r\n"]))
        response = self.response_class(self.sock, method=self._method)  # type: ignore[attr-defined]
        try:
            _, status, text = response._read_status()  # type: ignore[attr-defined]
            if status != http.HTTPStatus.OK:
                self.close()
                raise TunnelRefused(int(status), str(text).strip()[:80])
            while True:  # the rest of the head
                line = response.fp.readline(_MAX_LINE + 1)
                if len(line) > _MAX_LINE:
                    raise http.client.LineTooLong("header line")
                if line in (b"\r\n", b"\n", b""):
                    break
        finally:
            response.close()


class TunnelSocket:
    """The socket face of a TLS stream inside another TLS connection: what ``http.client``
    calls on ``conn.sock`` (send, a buffered reader, timeouts, shutdown, close).

    Like a socket's, ``close`` ends the stream only once the readers ``makefile`` handed out
    are closed too: ``http.client`` closes the connection as soon as a response says the server
    will close it, and the response still reads its body through its reader."""

    def __init__(self, stream: TlsStream) -> None:
        self.stream = stream
        self._lock = threading.Lock()
        self._readers = 0
        self._closed = False

    def sendall(self, data: bytes | memoryview) -> None:
        self.stream.sendall(data)

    def makefile(
        self, mode: str = "rb", buffering: int = io.DEFAULT_BUFFER_SIZE
    ) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError("a tunnel socket reads only")
        with self._lock:
            self._readers += 1
        return io.BufferedReader(_TunnelReader(self), buffer_size=buffering or 8192)

    def settimeout(self, seconds: float | None) -> None:
        self.stream.settimeout(seconds)

    def setsockopt(self, *args: int) -> None:
        self.stream.raw.setsockopt(*args)

    def shutdown(self, how: int) -> None:
        self.stream.raw.shutdown(how)  # a read blocked on another thread returns

    def close(self) -> None:
        with self._lock:
            self._closed = True
            last = self._readers <= 0
        if last:
            self.stream.close()

    def reader_closed(self) -> None:
        with self._lock:
            self._readers -= 1
            last = self._closed and self._readers <= 0
        if last:
            self.stream.close()


class _TunnelReader(io.RawIOBase):
    def __init__(self, sock: TunnelSocket) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        return self.sock.stream.recv_into(memoryview(buffer).cast("B"))

    def close(self) -> None:
        if not self.closed:
            super().close()
            self.sock.reader_closed()


class ProxyTlsConnection(TypedTunnel):
    """A connection to an ``https://`` proxy; ``set_tunnel`` (an ``https://`` destination)
    adds the CONNECT tunnel and the destination's TLS with ``target_tls``."""

    def __init__(
        self,
        proxy_url: str,
        host: str,
        port: int,
        proxy_tls: ssl.SSLContext,
        target_tls: ssl.SSLContext | None,
        timeout: float | None,
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self.proxy_url = proxy_url
        self.proxy_tls = proxy_tls
        self.target_tls = target_tls

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            outer = self.proxy_tls.wrap_socket(raw, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            raw.close()
            raise SourceUnavailable(
                f"TLS to the import proxy {redact_url(self.proxy_url)} failed: "
                f"{exc.verify_message}; its CA belongs in the ConfigMap that CDIConfig "
                "importProxy.trustedCAProxy names",
                transient=False,
            ) from exc
        except BaseException:
            raw.close()
            raise
        self.sock = outer
        if self._tunnel_host is None:  # type: ignore[attr-defined]
            return
        try:
            self._tunnel()  # type: ignore[attr-defined]
            if self.target_tls is None:
                raise ValueError("an https destination needs its TLS context")
            destination = str(self._tunnel_host)  # type: ignore[attr-defined]
            inner = TlsStream.connect(outer, self.target_tls, destination)
        except BaseException:
            outer.close()
            raise
        inner.widen()  # image bytes: large socket reads
        self.sock = TunnelSocket(inner)  # type: ignore[assignment]
