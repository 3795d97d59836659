"""The upload proxy: CDI's ``cdi-uploadproxy`` as an aiohttp app factory, streaming end to end.

``make_proxy_app(targets, verifier, upstream_tls, config)`` serves ``GET /healthz`` and the
upload paths (``/v1beta1|v1alpha1/upload[-async]``, ``.../upload-form[-async]``). Each upload
request goes through CDI's checks in CDI's order (``uploadproxy.go``): ``Authorization``
missing or not ``Bearer <token>`` -> 400; token invalid -> 401; a valid token that is not an
upload token -> 400; then the PVC checks of ``readiness.py`` (503 with CDI's messages); an
archive PVC is sent to ``upload-archive``, another content type -> 503. Refusal bodies are
HTML-escaped (CDI's XSS test). The request is then relayed over mutual TLS (``upstream_tls``
holds our client certificate and the upload servers' CA) to the PVC's upload server, whose
status, headers and body come back unchanged; an unreachable server is CDI's 502.

Why it is shaped so:
- Nothing is buffered. The request body is read piece by piece and handed to the aiohttp
  client as an async generator: the client pulls the next piece only after the previous one
  was written, and aiohttp stops reading the socket while a piece waits, so a slow upload
  server slows the uploader (backpressure) and memory stays flat whatever the image size.
- No total timeout: an upload may take hours. A body that stops flowing for ``idle_timeout``
  seconds ends the request instead; the upload server's answer (a sync upload answers after
  conversion, T6) may take up to ``response_timeout`` (24 h, CDI's).
- HEAD and PATCH go through the same checks and relay, so tus 1.0 core (HEAD answers
  ``Upload-Offset``, PATCH continues there) works through the proxy on the same token; CORS
  preflights (OPTIONS) are answered here and every response to a request with an ``Origin``
  carries ``Access-Control-Allow-Origin: *`` (CDI's ``cors.AllowAll``).
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict

from cdi.api.constants import ANN_CONTENT_TYPE
from cdi.upload.errors import (
    BadUploadRequest,
    UploadError,
    UploadInterrupted,
    UploadNotReady,
    UploadServerUnreachable,
)
from cdi.upload.readiness import PVC, UploadTargets, wait_for_upload_target
from cdi.upload.token import UploadGrant

log = logging.getLogger(__name__)

DIAL_RETRY_SECONDS = 10.0  # how long a refused or reset dial of the upload server is retried
DIAL_RETRY_INTERVAL = 0.5

UPLOAD_PATHS = tuple(
    f"/{version}/{kind}"
    for version in ("v1beta1", "v1alpha1")
    for kind in ("upload", "upload-async", "upload-form", "upload-form-async")
)
RELAYED_METHODS = ("POST", "HEAD", "PATCH")
_BEARER = r"(?i)^Bearer\s+([A-Za-z0-9\-\._~\+\/]+)$"
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Authorization",
        # CDI's clone marker: only the cloner, talking to the upload server directly, may ask
        # for the clone stream decoding; an uploader must not select it through the proxy.
        "X-Cdi-Content-Type",
    )
)
CORS_EXPOSED = "Upload-Offset, Upload-Length, Tus-Resumable, Tus-Version, Location"
TokenVerifier = Callable[[str], Awaitable[UploadGrant]]


@dataclass(frozen=True)
class ProxyConfig:
    ready_timeout: float = 10.0
    ready_interval: float = 1.0
    idle_timeout: float = 300.0  # seconds without a body byte before the request is dropped
    response_timeout: float = 24 * 3600.0
    connect_timeout: float = 10.0


def bearer_token(header: str | None) -> str:
    if not header:
        raise BadUploadRequest("missing Authorization header")
    match = re.match(_BEARER, header)
    if match is None:
        raise BadUploadRequest("the Authorization header is not 'Bearer <token>'")
    return match.group(1)


def upload_path(pvc: PVC, name: str, path: str) -> str:
    """CDI's ``resolveUploadPath``: archive PVCs go to the archive endpoint."""
    content_type = ((pvc.get("metadata") or {}).get("annotations") or {}).get(ANN_CONTENT_TYPE)
    if not content_type or content_type == "kubevirt":
        return path
    if content_type == "archive":
        version = "v1alpha1" if path.startswith("/v1alpha1/") else "v1beta1"
        return f"/{version}/upload-archive"
    raise UploadNotReady(
        f"rejecting upload request for PVC {name} - upload content-type {content_type} is invalid"
    )


class _Body:
    """The request body as it arrives, remembering why it stopped early (if it did): a body
    that stalls for ``idle_timeout`` seconds, or a cut client connection.

    Pieces are the buffers as the connection delivered them (``readchunk``: ``read(n)`` and
    ``readany`` join buffered pieces, a copy of every byte), and
    the stall is watched by one timer per request (``_watch``), not a timeout context per
    piece. Only time spent waiting for the client counts: while the upload server is slow
    (backpressure) the body is not being read and cannot stall."""

    def __init__(self, request: web.Request, idle_timeout: float) -> None:
        self.content = request.content
        self.idle_timeout = idle_timeout
        self.failure: UploadInterrupted | None = None
        self.waiting_since: float | None = None  # loop time a read began; None between reads
        self.watchdog: asyncio.TimerHandle | None = None
        self.started = False  # a piece was read: the request can no longer be sent again

    def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        since = self.waiting_since
        if since is not None and loop.time() - since >= self.idle_timeout:
            self.failure = UploadInterrupted(f"no upload data for {self.idle_timeout:g} seconds")
            self.content.set_exception(self.failure)
            return
        wake = (since if since is not None else loop.time()) + self.idle_timeout
        self.watchdog = loop.call_at(wake, self._watch)

    async def pieces(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        self._watch()
        try:
            while True:
                self.waiting_since = loop.time()
                try:
                    piece, chunk_end = await self.content.readchunk()
                except UploadInterrupted:
                    raise
                except (ConnectionError, aiohttp.ClientPayloadError) as exc:
                    self.failure = UploadInterrupted(f"the upload connection was cut: {exc}")
                    raise self.failure from exc
                self.waiting_since = None
                if piece:
                    self.started = True
                    yield piece
                elif not chunk_end:  # (b"", True) only marks a chunked body's chunk end
                    return
        finally:
            if self.watchdog is not None:
                self.watchdog.cancel()


def _forwarded(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


def _unreachable(url: str, exc: BaseException) -> UploadServerUnreachable:
    if isinstance(exc, aiohttp.ClientConnectorError):
        detail = f"dial tcp {exc.host}:{exc.port}: connect: {_describe(exc.os_error)}"
    else:
        detail = str(exc) or type(exc).__name__
    log.warning("upload server %s unreachable: %s", url, detail)
    return UploadServerUnreachable(f"error in upload-proxy: http: proxy error: {detail}")


def _describe(err: OSError) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    return err.strerror or str(err)


class Relay:
    """Streams one request to an upload server and its answer back (mutual TLS)."""

    def __init__(self, session: aiohttp.ClientSession, config: ProxyConfig) -> None:
        self.session = session
        self.config = config

    def _timeout(self) -> aiohttp.ClientTimeout:
        c = self.config
        return aiohttp.ClientTimeout(
            total=None, sock_connect=c.connect_timeout, sock_read=c.response_timeout
        )

    async def __call__(
        self, request: web.Request, url: str, server_hostname: str | None = None
    ) -> web.StreamResponse:
        body = _Body(request, self.config.idle_timeout)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + DIAL_RETRY_SECONDS
        while True:
            try:
                upstream = await self.session.request(
                    request.method,
                    url,
                    data=body.pieces() if request.method != "HEAD" else None,
                    headers=_forwarded(request.headers),
                    timeout=self._timeout(),
                    allow_redirects=False,
                    auto_decompress=False,
                    server_hostname=server_hostname,
                )
                break
            except (aiohttp.ClientError, TimeoutError, UploadInterrupted) as exc:
                if body.failure is not None:
                    raise body.failure from exc
                # The Service may not route to a pod that just became ready (endpoints lag
                # behind the pod's Ready condition, which readiness.py waited for): a dial that
                # failed before any body byte was read is tried again for a few seconds.
                retry = isinstance(exc, aiohttp.ClientConnectorError) and not body.started
                if not retry or loop.time() >= give_up:
                    raise _unreachable(url, exc) from exc
                await asyncio.sleep(DIAL_RETRY_INTERVAL)
        try:
            return await self._answer(request, upstream)
        finally:
            upstream.release()

    async def _answer(
        self, request: web.Request, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.update(_forwarded(upstream.headers))
        await response.prepare(request)
        try:
            async for piece in upstream.content.iter_any():
                await response.write(piece)
            await response.write_eof()
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            log.warning("relaying the upload server's answer failed: %s", exc)
            response.force_close()
        return response


def _refusal(err: UploadError) -> web.Response:
    return web.Response(status=err.status, text=html.escape(err.message))


async def _add_cors(request: web.Request, response: web.StreamResponse) -> None:
    if hdrs.ORIGIN in request.headers:
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = "*"
        response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = CORS_EXPOSED


async def _preflight(request: web.Request) -> web.Response:
    asked = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "")
    headers = {hdrs.ACCESS_CONTROL_ALLOW_METHODS: "HEAD, GET, POST, PATCH, OPTIONS"}
    if asked:
        headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = asked
    return web.Response(status=204, headers=headers)


SESSION = web.AppKey("upload_session", aiohttp.ClientSession)


def make_proxy_app(
    targets: UploadTargets,
    verify: TokenVerifier,
    upstream_tls: ssl.SSLContext,
    config: ProxyConfig = ProxyConfig(),
) -> web.Application:
    """The proxy's routes; the client session lives as long as the app (``cleanup_ctx``)."""

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(ssl=upstream_tls, limit=0)
        app[SESSION] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        yield
        await app[SESSION].close()

    async def upload(request: web.Request) -> web.StreamResponse:
        try:
            grant = await verify(bearer_token(request.headers.get(hdrs.AUTHORIZATION)))
            pvc = await wait_for_upload_target(
                targets, grant, limit=config.ready_timeout, interval=config.ready_interval
            )
            path = upload_path(pvc, grant.name, request.path)
            pvc_name = str((pvc.get("metadata") or {}).get("name") or grant.name)
            server = await targets.upload_server(grant.namespace, pvc_name)
            log.info("upload to PVC %s/%s via %s", grant.namespace, grant.name, server.url)
            relay = Relay(request.app[SESSION], config)
            return await relay(request, server.url + path, server.server_hostname)
        except UploadError as err:
            return _refusal(err)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="OK")

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.on_response_prepare.append(_add_cors)
    app.router.add_get("/healthz", healthz)
    for path in UPLOAD_PATHS:
        for method in RELAYED_METHODS:
            app.router.add_route(method, path, upload)
        app.router.add_route("OPTIONS", path, _preflight)
    return app
