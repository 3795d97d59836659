"""The upload client: moves a local file to an upload proxy or upload server, resuming.

``upload_file(path, settings, token, progress)`` is what ``cdi upload`` and the tests use. It
knows HTTP only (no ``kubernetes`` import: the CLI gets the token and the URL):

1. ``HEAD <base>/v1beta1/upload-async``: 200 means the server answers once the bytes are in
   (virtctl's async detection), else the sync path ``/v1beta1/upload`` is used;
2. ``POST`` the file, streamed from disk in pieces (never read whole), with
   ``Content-Length`` and the tus ``Upload-Length``; ``progress(bytes, rate)`` after each piece;
3. on a cut connection or a transient answer (408, 502, 503): ``HEAD`` for ``Upload-Offset``
   and ``PATCH`` from there (tus 1.0 core). A server that restarted and lost a non-raw upload
   answers offset 0 with a ``Cdi-Upload-Restart`` note: the file is sent again from byte 0
   and the result says so. Attempts are bounded, with jittered exponential backoff;
4. on 401 the token provider is asked for a fresh token (bounded) and the step is repeated;
5. any other refusal is a typed ``UploadRejected`` carrying the server's status and message.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from cdi.api.errors import WorkerError

TokenProvider = Callable[[], str | Awaitable[str]]
ProgressCallback = Callable[[int, float], None]  # (bytes the server has, bytes per second)
PIECE = 1024 * 1024
RESTART_HEADER = "Cdi-Upload-Restart"
_TRANSIENT = frozenset({408, 502, 503, 504})
_CUT = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


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
        if answer.status != 200:
            raise UploadRejected(answer.status, answer.text or "HEAD refused")
        try:
            at = int(answer.headers.get("Upload-Offset", "0"))
        except ValueError:
            at = 0
        return at, answer.headers.get(RESTART_HEADER, "")

    async def send(self, path: str, file: str, size: int, at: int) -> _Answer:
        started, base = time.monotonic(), at

        async def pieces() -> AsyncIterator[bytes]:
            done = at
            fh = await asyncio.to_thread(open, file, "rb")
            try:
                await asyncio.to_thread(fh.seek, at)
                while piece := await asyncio.to_thread(fh.read, self.settings.piece):
                    yield piece
                    done += len(piece)
                    if self.progress is not None:
                        elapsed = max(time.monotonic() - started, 1e-6)
                        self.progress(done, (done - base) / elapsed)
            finally:
                fh.close()

        headers = {"Content-Length": str(size - at)}
        if at:
            method = "PATCH"
            headers |= {"Upload-Offset": str(at), "Content-Type": "application/offset+octet-stream"}
        else:
            method = "POST"
            headers |= {"Upload-Length": str(size), "Content-Type": "application/octet-stream"}
        return await self._request(method, path, data=pieces(), headers=headers)

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
            except _CUT:
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
