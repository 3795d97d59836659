"""The upload server's HTTP face: CDI's endpoints and statuses, plus tus 1.0 core for resume.

``make_app(uploads, client_name)`` serves ``GET /healthz`` and, for a client whose
verified certificate has CN ``client_name`` (else 401, as CDI), the upload paths (the TLS
layer lets no client without a certificate from the client CA through, see
``serving_context``; the kubelet's readiness probe is a TCP connect):

    POST  /v1beta1|v1alpha1/upload            sync: answers after conversion and resize
    POST  .../upload-async                    answers once the bytes are in, converts after
    POST  .../upload-form[-async]             multipart, the part named ``file``, streamed
    POST  .../upload-archive                  a tar extracted into the volume
    HEAD  any of them                         200 + ``Upload-Offset`` (CDI: async detection)
    PATCH any of them                         tus: continue at ``Upload-Offset``
    OPTIONS any of them                       tus: ``Tus-Version: 1.0.0``

Other methods are 404 (CDI). Statuses: another upload in flight 503, the pod already done
409, an image larger than the volume 400 and any other failure 500, both with CDI's
``Saving stream failed: ...`` text built from the typed error (never a traceback). Bodies
are read in pieces as they arrive (``iter_any``, ``read_chunk``) and never buffered whole.

The app is served on asyncio's TLS behind the door of ``tlsfront.py`` (its limits): the CN
comes from the certificate the TLS layer verified for the connection, never from anything the
client sends.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, web

from cdi.api.constants import ContentType
from cdi.api.errors import InsufficientSpace
from cdi.api.termination import TerminationMessage
from cdi.api.tlsprofile import INTERMEDIATE, TLSProfile
from cdi.api.tlsprofile import apply as apply_tls_profile
from uploader.body import Busy, Feed, OffsetMismatch
from uploader.session import RESTART_NOTE, AlreadyDone, Mode, Upload, Uploads
from uploader.tlsfront import common_name

TUS_VERSION = "1.0.0"
RECEIVE_PIECE = 1024 * 1024  # a multipart part is read in these; the data path coalesces
CLONE_HEADER = "x-cdi-content-type"
RESTART_HEADER = "Cdi-Upload-Restart"  # HEAD after a restart that lost a non-raw upload
TOO_LARGE = "effective image size is larger than the reported available storage"
_KINDS = ("upload", "upload-async", "upload-form", "upload-form-async", "upload-archive")
UPLOAD_PATHS = tuple(f"/{v}/{k}" for v in ("v1beta1", "v1alpha1") for k in _KINDS)
_CLONE_TYPES = {
    "filesystem-clone": ContentType.FILESYSTEM_CLONE,
    "blockdevice-clone": ContentType.BLOCKDEVICE_CLONE,
    "blockdevice-clone-sparse": ContentType.BLOCKDEVICE_CLONE_SPARSE,
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def peer_common_name(request: web.Request) -> str | None:
    """The CN of the client certificate the TLS layer verified for this request's
    connection; None without one."""
    transport = request.transport
    if transport is None:
        return None
    return common_name(transport.get_extra_info("peercert"))


def mode_of(request: web.Request, default: ContentType) -> Mode:
    kind = request.path.rsplit("/", 1)[1]
    content_type = ContentType.ARCHIVE if kind == "upload-archive" else default
    clone = request.headers.get(CLONE_HEADER, "").strip().lower()
    if clone in _CLONE_TYPES:
        content_type = _CLONE_TYPES[clone]
    return Mode(content_type=content_type, sync=not kind.endswith("-async"))


def tus_headers(upload: Uploads) -> dict[str, str]:
    headers = {"Tus-Resumable": TUS_VERSION, "Cache-Control": "no-store"}
    current, done = upload.current, upload.outcome
    if done is not None and done.succeeded:
        headers["Upload-Offset"] = str(done.bytes_read)
    elif current is not None and not current.task.done():
        headers["Upload-Offset"] = str(current.body.offset)
        if current.body.length is not None:
            headers["Upload-Length"] = str(current.body.length)
    else:
        saved = upload.saved()
        headers["Upload-Offset"] = str(saved.offset if saved else 0)
        if saved is not None and saved.offset:
            headers["Upload-Length"] = str(saved.size)
        elif saved is not None:
            headers[RESTART_HEADER] = RESTART_NOTE
    return headers


def failure_response(message: TerminationMessage) -> web.Response:
    """CDI's answer for a failed upload: 400 when it does not fit, else 500."""
    if message.reason == InsufficientSpace.reason:
        return web.Response(
            status=400, text=f"Saving stream failed: {TOO_LARGE}: {message.message}"
        )
    return web.Response(status=500, text=f"Saving stream failed: {message.message}")


async def _request_pieces(request: web.Request) -> AsyncIterator[bytes]:
    """The body as it arrives (``iter_any``: no re-chunking copy; the data path coalesces
    pieces into its chunk size once)."""
    async for piece in request.content.iter_any():
        yield piece


async def _form_pieces(request: web.Request) -> AsyncIterator[bytes] | None:
    """The part named ``file`` of a multipart body, streamed; None without one."""
    reader = await request.multipart()
    async for part in reader:
        if isinstance(part, BodyPartReader) and part.name == "file":
            return _part_pieces(part)
    return None


async def _part_pieces(part: BodyPartReader) -> AsyncIterator[bytes]:
    while piece := await part.read_chunk(RECEIVE_PIECE):
        yield piece


def _upload_length(request: web.Request) -> int | None:
    """tus ``Upload-Length`` (a chunked body has no ``Content-Length``)."""
    text = request.headers.get("Upload-Length", "")
    return int(text) if text.isdigit() else None


class UploadHandlers:
    def __init__(self, uploads: Uploads) -> None:
        self.uploads = uploads

    async def post(self, request: web.Request) -> web.StreamResponse:
        mode = mode_of(request, self.uploads.config.content_type)
        form = "/upload-form" in request.path
        if not mode.sync and mode.content_type in _CLONE_TYPES.values():
            return web.Response(status=400, text="async clone not supported")
        try:
            pieces = await _form_pieces(request) if form else _request_pieces(request)
            if pieces is None:
                return web.Response(status=400, text="the form has no part named 'file'")
            length = None if form else (request.content_length or _upload_length(request))
            upload = await self.uploads.begin(mode, length)
        except AlreadyDone:
            return web.Response(status=409, text="upload already completed")
        except Busy:
            return web.Response(status=503, text="an upload is already in progress")
        return await self._receive(upload, pieces, 0, tus=False)

    async def patch(self, request: web.Request) -> web.StreamResponse:
        mode = mode_of(request, self.uploads.config.content_type)
        try:
            at = int(request.headers.get("Upload-Offset", ""))
            length = int(request.headers.get("Upload-Length") or -1)
        except ValueError:
            return web.Response(status=400, text="Upload-Offset must be a number", headers=_TUS)
        try:
            upload = await self.uploads.resume(mode, at, None if length < 0 else length)
            return await self._receive(upload, _request_pieces(request), at, tus=True)
        except AlreadyDone:
            return web.Response(status=409, text="upload already completed", headers=_TUS)
        except OffsetMismatch as exc:
            return web.Response(status=409, text=str(exc), headers=tus_headers(self.uploads))
        except Busy:
            return web.Response(status=503, text="the upload is still receiving", headers=_TUS)

    async def _receive(
        self, upload: Upload, pieces: AsyncIterator[bytes], at: int, *, tus: bool
    ) -> web.StreamResponse:
        feed = await _attach(upload, pieces, at)
        await asyncio.wait((feed.ended, upload.task), return_when=asyncio.FIRST_COMPLETED)
        if upload.task.done() or feed.ended.result() is None:  # None: the data path stopped
            return self._answer(await upload.task, tus)
        if not feed.ended.result():
            return web.Response(
                status=500,
                text=f"Saving stream failed: the request body was cut at byte "
                f"{upload.body.offset}; HEAD for Upload-Offset and PATCH to continue",
            )
        if not upload.body.finished:  # a partial PATCH: more to come
            return web.Response(status=204, headers=tus_headers(self.uploads))
        if not upload.mode.sync:
            done = asyncio.ensure_future(upload.processor.transfer_done.wait())
            await asyncio.wait((done, upload.task), return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
            if not upload.task.done():
                upload.answered_early = True
                return self._success(tus)
        return self._answer(await upload.task, tus)

    def _answer(self, message: TerminationMessage, tus: bool) -> web.Response:
        return self._success(tus) if message.succeeded else failure_response(message)

    def _success(self, tus: bool) -> web.Response:
        if tus:
            return web.Response(status=204, headers=tus_headers(self.uploads))
        return web.Response(status=200, headers=tus_headers(self.uploads))

    async def head(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, headers=tus_headers(self.uploads))

    async def options(self, request: web.Request) -> web.StreamResponse:
        headers = {"Tus-Version": TUS_VERSION, "Tus-Resumable": TUS_VERSION}
        return web.Response(status=204, headers=headers)


_TUS = {"Tus-Resumable": TUS_VERSION}


async def _attach(upload: Upload, pieces: AsyncIterator[bytes], at: int) -> Feed:
    """Attach, waiting a little if the previous body's cut has not been noticed yet (the
    client may see its connection die before this server does)."""
    for _ in range(50):
        try:
            return upload.body.attach(pieces, at)
        except Busy:
            await asyncio.sleep(0.1)
    return upload.body.attach(pieces, at)


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.Response(text="OK")


def _client_check(client_name: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != "/healthz" and peer_common_name(request) != client_name:
            return web.Response(status=401, text="client certificate required")
        return await handler(request)

    return check


async def not_found(request: web.Request) -> web.StreamResponse:
    return web.Response(status=404, text="404: Not Found")


def make_app(uploads: Uploads, client_name: str) -> web.Application:
    app = web.Application(middlewares=[_client_check(client_name)])
    handlers = UploadHandlers(uploads)
    app.router.add_get("/healthz", healthz)
    for path in UPLOAD_PATHS:
        app.router.add_post(path, handlers.post)
        app.router.add_patch(path, handlers.patch)
        app.router.add_route("HEAD", path, handlers.head)
        app.router.add_route("OPTIONS", path, handlers.options)
        app.router.add_route("*", path, not_found)
    return app


def serving_context(
    cert: str, key: str, client_ca: str, profile: TLSProfile = INTERMEDIATE
) -> ssl.SSLContext:
    """The TLS profile the controller rendered (CDIConfig's; default Intermediate: TLS 1.2+), our
    serving pair, a client certificate required and verified against the
    client CA: a client without one fails the handshake (CDI asks for it optionally and
    answers 401 from the app; then anyone who reaches the pod held its connections, N4). A
    certificate from the client CA with another CN is still answered 401 by the app."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    apply_tls_profile(ctx, profile)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    # No TLS 1.3 session tickets: they are the only bytes a server sends unasked, and a
    # client (or relay) that closes with them unread resets the connection, which makes the
    # kernel drop the request bytes this server has not read yet (a cut upload then loses
    # what it had sent). Resumption would only save the handshake of a HEAD or a PATCH.
    ctx.num_tickets = 0
    return ctx
