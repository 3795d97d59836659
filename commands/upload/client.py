"""The upload client: moves a local file to an upload proxy or upload server, resuming.

``upload_file(path, settings, token, progress)`` is what ``cdi upload`` and the tests use. It
knows HTTP only (no ``kubernetes`` import: the CLI gets the token and the URL):

1. ``HEAD <base>/v1beta1/upload-async``: 200 means the server answers once the bytes are in
   (virtctl's async detection), else the sync path ``/v1beta1/upload`` is used;
2. ``POST`` the file, streamed from disk in 1 MiB pieces (never read whole) on a blocking TLS
   socket in a thread (``_BodySender``: half the CPU of asyncio's TLS), with ``Content-Length``
   and the tus ``Upload-Length``; ``progress(bytes, rate)`` after each piece, on the loop;
3. on a cut connection or a transient answer (408, 502, 503): ``HEAD`` for ``Upload-Offset``
   and ``PATCH`` from there (tus 1.0 core). A server that restarted and lost a non-raw upload
   answers offset 0 with a ``Cdi-Upload-Restart`` note: the file is sent again from byte 0
   and the result says so. Attempts are bounded, with jittered exponential backoff;
4. on 401 the token provider is asked for a fresh token (bounded) and the step is repeated;
5. any other refusal is a typed ``UploadRejected`` carrying the server's status and message.
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import os
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

import aiohttp

from cdi.api.errors import WorkerError

TokenProvider = Callable[[], str | Awaitable[str]]
ProgressCallback = Callable[[int, float], None]  # (bytes the server has, bytes per second)
PIECE = 1024 * 1024
RESTART_HEADER = "Cdi-Upload-Restart"
_TRANSIENT = frozenset({408, 502, 503, 504})
_CUT = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


class _ServerAway(Exception):
    """A HEAD answered with a transient status: ask again after a backoff, like a cut."""


class UploadClientError(WorkerError):
    reason = "UploadFailed"


class UploadRejected(UploadClientError):
    """The server answered with a final error status; ``message`` is what it said."""

    reason = "UploadRejected"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message.strip()}")
        self.status = status
        self.server_message = message.strip()


class UploadUnauthorized(UploadRejected):
    reason = "Unauthorized"


class UploadGaveUp(UploadClientError):
    """The connection kept failing (or the server kept answering 'try later') past the bound."""

    reason = "UploadInterrupted"
    transient = True


@dataclass(frozen=True)
class ClientSettings:
    base_url: str  # https://proxy[:port] or https://upload-server:8443, no path
    ssl: ssl.SSLContext | bool = True  # False: do not verify (``--insecure``)
    attempts: int = 5  # sends after a cut or a transient answer
    token_refreshes: int = 3
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    archive: bool = False  # straight to an upload server: the archive endpoint
    detect_async: bool = True
    piece: int = PIECE
    connect_timeout: float = 30.0


@dataclass
class UploadResult:
    path: str  # the endpoint that took the upload
    size: int
    seconds: float = 0.0
    resumed: int = 0  # continuations at a non-zero offset (PATCH)
    restarted: list[str] = field(default_factory=list)  # why the server made us start over


@dataclass
class _Answer:
    status: int
    text: str
    headers: dict[str, str]


async def _token(provider: TokenProvider | None) -> str | None:
    if provider is None:
        return None
    value = provider()
    return await value if inspect.isawaitable(value) else value


class _BodySender:
    """One request whose body is a file, on a blocking ``http.client`` connection.

    Why not aiohttp for the body: asyncio's TLS layer encrypts through memory BIOs on the
    event loop thread, which cost the client as much CPU as the whole upload server spent
    (2.1 s per 695 MB measured); a blocking TLS socket encrypts in C with the GIL released, in
    1 MiB writes. The same reason made the importer read HTTP on threads (architecture.md).
    """

    def __init__(self, url: SplitResult, headers: dict[str, str], settings: ClientSettings) -> None:
        self.url, self.headers, self.settings = url, headers, settings
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        host, port, s = self.url.hostname or "", self.url.port, self.settings
        if self.url.scheme == "https":
            ctx = s.ssl if isinstance(s.ssl, ssl.SSLContext) else ssl.create_default_context()
            if s.ssl is False:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, context=ctx, timeout=s.connect_timeout, blocksize=s.piece
            )
        else:
            conn = http.client.HTTPConnection(
                host, port, timeout=s.connect_timeout, blocksize=s.piece
            )
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(None)  # a sync upload answers only after conversion
        return conn

    def send(self, method: str, file: str, at: int, report: Callable[[int], None]) -> _Answer:
        self.conn = conn = self._connect()
        try:
            conn.putrequest(method, self.url.path, skip_accept_encoding=True)
            for name, value in self.headers.items():
                conn.putheader(name, value)
            conn.endheaders()
            with open(file, "rb") as fh:
                fh.seek(at)
                done = at
                while piece := fh.read(self.settings.piece):
                    conn.send(piece)
                    done += len(piece)
                    report(done)
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
            return _Answer(resp.status, text, dict(resp.getheaders()))
        except (OSError, http.client.HTTPException) as exc:
            raise aiohttp.ClientConnectionError(f"the upload connection failed: {exc}") from exc
        finally:
            conn.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class UploadClient:
    def __init__(
        self,
        settings: ClientSettings,
        session: aiohttp.ClientSession,
        token: TokenProvider | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.settings = settings
        self.session = session
        self.provider = token
        self.progress = progress
        self.token: str | None = None
        self.refreshes = 0

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return {"Tus-Resumable": "1.0.0", **auth, **extra}

    async def _request(self, method: str, path: str, **kw: object) -> _Answer:
        url = self.settings.base_url.rstrip("/") + path
        headers = self._headers(kw.pop("headers", {}))  # type: ignore[arg-type]
        async with self.session.request(
            method,
            url,
            headers=headers,
            ssl=self.settings.ssl,
            **kw,  # type: ignore[arg-type]
        ) as resp:
            text = await resp.text(errors="replace")
            return _Answer(resp.status, text, dict(resp.headers))

    async def _refresh(self, answer: _Answer) -> None:
        if self.provider is None or self.refreshes >= self.settings.token_refreshes:
            raise UploadUnauthorized(answer.status, answer.text or "the upload token was refused")
        self.refreshes += 1
        self.token = await _token(self.provider)

    async def endpoint(self) -> str:
        if self.settings.archive:
            return "/v1beta1/upload-archive"
        if self.settings.detect_async:
            for _ in range(self.settings.token_refreshes + 1):
                answer = await self._request("HEAD", "/v1beta1/upload-async")
                if answer.status != 401:
                    break
                await self._refresh(answer)
            if answer.status == 200:
                return "/v1beta1/upload-async"
        return "/v1beta1/upload"

    async def offset(self, path: str) -> tuple[int, str]:
        """Where the server wants the next byte, and its note if it had to start over."""
        answer = await self._request("HEAD", path)
        if answer.status == 401:
            await self._refresh(answer)
            answer = await self._request("HEAD", path)
        if answer.status in _TRANSIENT:  # e.g. the proxy's 502/503 while the pod restarts
            raise _ServerAway(answer.status)
        if answer.status != 200:
            raise UploadRejected(answer.status, answer.text or "HEAD refused")
        try:
            at = int(answer.headers.get("Upload-Offset", "0"))
        except ValueError:
            at = 0
        return at, answer.headers.get(RESTART_HEADER, "")

    async def send(self, path: str, file: str, size: int, at: int) -> _Answer:
        """Send the file from ``at``: POST from 0, PATCH (tus) past it. The body goes out on a
        blocking TLS socket on a worker thread (``_send_body``), progress comes back to the
        event loop."""
        headers = {"Content-Length": str(size - at)}
        if at:
            method = "PATCH"
            headers |= {"Upload-Offset": str(at), "Content-Type": "application/offset+octet-stream"}
        else:
            method = "POST"
            headers |= {"Upload-Length": str(size), "Content-Type": "application/octet-stream"}
        loop, started = asyncio.get_running_loop(), time.monotonic()

        def report(done: int) -> None:
            if self.progress is not None:
                rate = (done - at) / max(time.monotonic() - started, 1e-6)
                loop.call_soon_threadsafe(self.progress, done, rate)

        url = urlsplit(self.settings.base_url.rstrip("/") + path)
        sender = _BodySender(url, self._headers(headers), self.settings)
        try:
            return await asyncio.to_thread(sender.send, method, file, at, report)
        except asyncio.CancelledError:
            sender.close()  # unblocks the thread
            raise

    async def upload(self, file: str) -> UploadResult:
        size = (await asyncio.to_thread(os.stat, file)).st_size
        self.token = await _token(self.provider)
        started = time.monotonic()
        path = await self.endpoint()
        result = UploadResult(path=path, size=size)
        at, failures = 0, 0
        while True:
            try:
                answer = await self.send(path, file, size, at)
            except _CUT:
                answer = None
            if answer is not None and answer.status in (200, 201, 204):
                reached = int(answer.headers.get("Upload-Offset", size) or size)
                if reached >= size:
                    result.seconds = time.monotonic() - started
                    return result
            elif answer is not None and answer.status == 401:
                await self._refresh(answer)
            elif answer is not None and not (
                answer.status in _TRANSIENT or (answer.status == 409 and at)
            ):
                raise UploadRejected(answer.status, answer.text)
            else:
                failures += 1
                if failures > self.settings.attempts:
                    raise UploadGaveUp(f"the upload kept failing; gave up after {failures} tries")
                await self._backoff(failures)
            at = await self._where(path, result, failures)

    async def _where(self, path: str, result: UploadResult, failures: int) -> int:
        """The offset to continue at, retrying the HEAD itself while the server is away."""
        while True:
            try:
                at, note = await self.offset(path)
            except (*_CUT, _ServerAway):
                failures += 1
                if failures > self.settings.attempts:
                    raise UploadGaveUp("the upload server stayed unreachable") from None
                await self._backoff(failures)
                continue
            if note:
                result.restarted.append(note)
            elif at:
                result.resumed += 1
            return at

    async def _backoff(self, failures: int) -> None:
        s = self.settings
        delay = min(s.backoff_max, s.backoff_initial * 2 ** (failures - 1))
        await asyncio.sleep(delay * (0.5 + random.random() / 2))


async def upload_file(
    file: str,
    settings: ClientSettings,
    token: TokenProvider | None = None,
    progress: ProgressCallback | None = None,
) -> UploadResult:
    """Upload ``file``; raises ``UploadRejected`` / ``UploadGaveUp`` with the server's words."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout)
    connector = aiohttp.TCPConnector(limit=2, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        return await UploadClient(settings, session, token, progress).upload(file)
