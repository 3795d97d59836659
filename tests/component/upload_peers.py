"""Test peers for the upload proxy: a PKI made by our own certs code, and a small real aiohttp
"upload server" peer that demands our client certificate, counts the bytes it receives and
answers with the status a test asks for. A test peer, not a product stand-in: the real upload
server is ``uploader/``."""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from cdi.pki.certs import KeyPair, issue_client, issue_serving, new_ca
from cdi.pki.contexts import UPLOAD_CLIENT_NAME, serving_context, upstream_context
from cdi.upload.keys import KeyRing, new_key

NOW = dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Pki:
    server_ca: KeyPair  # signs upload servers' serving certificates
    client_ca: KeyPair  # signs the proxy's client certificate
    server: KeyPair  # the peer's serving certificate (127.0.0.1)
    client: KeyPair  # the proxy's client certificate
    proxy: KeyPair  # the proxy's own serving certificate (127.0.0.1)
    proxy_ca: KeyPair
    ring: KeyRing

    def upstream(self) -> ssl.SSLContext:
        return upstream_context(self.server_ca.cert_pem, self.client)

    def proxy_serving(self) -> ssl.SSLContext:
        return serving_context(self.proxy)

    def peer_serving(self) -> ssl.SSLContext:
        ctx = serving_context(self.server, self.client_ca.cert_pem)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_trusting_proxy(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.proxy_ca.cert_pem.decode())


def make_pki() -> Pki:
    server_ca, client_ca = new_ca("test-uploadserver-ca", NOW), new_ca("test-client-ca", NOW)
    proxy_ca = new_ca("test-proxy-ca", NOW)
    return Pki(
        server_ca,
        client_ca,
        issue_serving(server_ca, ("127.0.0.1", "cdi-upload-disk.tenant.svc"), NOW),
        issue_client(client_ca, UPLOAD_CLIENT_NAME, NOW),
        issue_serving(proxy_ca, ("127.0.0.1",), NOW),
        proxy_ca,
        KeyRing(new_key(NOW)),
    )


@dataclass
class Seen:
    method: str
    path: str
    port: int
    headers: dict[str, str]
    received: int = 0
    complete: bool = False  # the whole body arrived
    ended: bool = False  # the peer stopped reading (whole body or cut)


@dataclass
class UploadPeer:
    """What the peer saw, and what it answers: ``replies[path] = (status, body, headers)``."""

    replies: dict[str, tuple[int, str, dict[str, str]]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        cert: Any = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(x[0] for x in (cert or {}).get("subject", ()))
        if subject.get("commonName") != UPLOAD_CLIENT_NAME:
            return web.Response(status=401, text="client certificate required")
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        seen = Seen(request.method, request.path, sock[1] if sock else 0, dict(request.headers))
        self.seen.append(seen)
        try:
            async for piece in request.content.iter_chunked(1 << 20):
                seen.received += len(piece)
        except Exception:  # a cut body: the real upload server answers 500 and stays ready
            return web.Response(status=500, text="Saving stream failed: body cut")
        finally:
            seen.ended = True
        seen.complete = True
        status, body, headers = self.replies.get(request.path, (200, "", {}))
        return web.Response(status=status, text=body, headers=headers)
