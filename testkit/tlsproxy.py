"""An HTTPS forward proxy on loopback for the ``importProxy.trustedCAProxy`` tests: it listens
with TLS (a certificate of the test's private CA), opens CONNECT tunnels for ``https://``
destinations and forwards absolute-form GET/HEAD requests for ``http://`` ones, one request per
connection. It records what it was asked for (``tunnels``, ``forwarded``), so a test can tell
an import went through it, or never reached it.

With ``tls=None`` it listens in plain http (an ``http://`` proxy). With ``credentials``
(``user:password``) it demands them as ``Proxy-Authorization: Basic``, as an authenticating
proxy does: any other value (or none) gets ``407 Proxy Authentication Required`` with a
``Proxy-Authenticate`` challenge, and nothing is forwarded; every value it was sent is kept in
``authorizations``.

asyncio streams on a thread of their own; a refused handshake (the importer not trusting the
certificate) is expected and not logged."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from testkit.registry import Tls


@dataclass
class TlsForwardProxy:
    tls: Tls | None
    credentials: str | None = None  # user:password it demands
    tunnels: list[str] = field(default_factory=list)  # CONNECT targets, host:port
    forwarded: list[str] = field(default_factory=list)  # absolute-form request lines
    authorizations: list[str | None] = field(default_factory=list)  # Proxy-Authorization seen
    refused: int = 0  # requests answered 407
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{'http' if self.tls is None else 'https'}://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> Path:
        """The CA that signed a TLS proxy's certificate (what trustedCAProxy holds)."""
        if self.tls is None:
            raise ValueError("a plain http proxy has no CA")
        return self.tls.ca_pem

    def url_with(self, userinfo: str) -> str:
        """The proxy's URL with ``userinfo`` (already percent-encoded) in it."""
        return self.url.replace("://", f"://{userinfo}@", 1)

    def _authorized(self, rest: bytes) -> bool:
        found = None
        for line in rest.split(b"\r\n"):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "proxy-authorization":
                found = value.strip()
        if self.credentials is None:
            return True
        self.authorizations.append(found)
        return found == "Basic " + base64.b64encode(self.credentials.encode()).decode()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(256 * 1024):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        line, _, rest = head.partition(b"\r\n")
        method, target, version = line.decode().split(" ", 2)
        if not self._authorized(rest):
            self.refused += 1
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="testkit"\r\nContent-Length: 0\r\n'
                b"Connection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        if method == "CONNECT":
            self.tunnels.append(target)
            host, port = target.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        elif method in ("GET", "HEAD") and target.startswith("http://"):
            self.forwarded.append(line.decode())
            parts = urlsplit(target)
            up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            headers = [
                h
                for h in rest.split(b"\r\n")
                if h and not h.lower().startswith((b"proxy-", b"connection:"))
            ]
            request = [f"{method} {path} {version}".encode(), *headers, b"Connection: close"]
            up_writer.write(b"\r\n".join(request) + b"\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> TlsForwardProxy:
        ctx = None
        if self.tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(self.tls.cert, self.tls.key)
        ready = threading.Event()

        async def main() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=ctx)
            self.port = int(self._server.sockets[0].getsockname()[1])
            ready.set()

        def thread() -> None:
            loop = self._loop = asyncio.new_event_loop()
            loop.set_exception_handler(lambda *_: None)  # refused handshakes are expected
            loop.run_until_complete(main())
            loop.run_forever()

        threading.Thread(target=thread, daemon=True, name="tls-proxy").start()
        if not ready.wait(10):
            raise RuntimeError("the TLS proxy did not start")
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is not None and server is not None:
            loop.call_soon_threadsafe(server.close)
            loop.call_soon_threadsafe(loop.stop)
