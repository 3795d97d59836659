"""HTTP(S) source: one streamed GET that survives the servers people actually run.

Handled here, once: HEAD refused or lying (we only use it as a hint), no ``Accept-Ranges``, wrong
``Content-Type`` (the format is sniffed from content), no ``Content-Length``, transient 5xx/429
(bounded, jittered retries with tenacity before any body byte is used), and a connection cut
mid-body: we resume with ``Range: bytes=N-``; a server that answers a range request with a full
200 is read again from the start with the first N bytes discarded, a bounded number of times.
An error status never yields a body byte, so an error page is never written as an image.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from cdi.api.errors import (
    SourceForbidden,
    SourceNotFound,
    SourceUnavailable,
    WorkerError,
)
from importer.sources import SourceInfo
from importer.sources.ranges import RangesUnsupported, parallel_ranges
from importer.streams import CHUNK_SIZE

USER_AGENT = "cdi-py-importer"
# What a connection cut mid-body looks like.
_CUT = (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError)
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class ProxyConfig:
    http: str | None = None
    https: str | None = None
    no_proxy: tuple[str, ...] = ()

    def for_url(self, url: str) -> str | None:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        for entry in self.no_proxy:
            entry = entry.strip().lower().lstrip(".")
            if entry == "*" or host == entry or host.endswith("." + entry):
                return None
        return self.https if parts.scheme == "https" else self.http


@dataclass(frozen=True)
class HttpOptions:
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    username: str | None = None
    password: str | None = None
    ca_files: tuple[str, ...] = ()
    insecure: bool = False
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    connections: int = 4  # parallel ranged connections when the server supports ranges
    segment_size: int = 8 * 1024 * 1024
    probe_bytes: int = 32 * 1024 * 1024  # the single stream's rate is judged after this much
    # bytes/s: a slower single stream switches to parallel (loopback gives 1.5-2 GB/s on one
    # connection, where splitting only costs; a per-connection limit shows up well below)
    parallel_below: float = 800e6
    attempts: int = 5  # per request, for transient statuses and connection errors
    resumes: int = 10  # mid-body cuts survived per import
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    read_timeout: float = 600.0  # CDI's idle watchdog: no byte for 10 minutes


def ssl_context(options: HttpOptions) -> ssl.SSLContext | bool:
    """Our own context only when the user changed trust; else aiohttp's verified default
    (building one loads the system CA store again: ~70 ms on every import)."""
    if not options.ca_files and not options.insecure:
        return True
    ctx = ssl.create_default_context()
    for path in options.ca_files:
        ctx.load_verify_locations(cafile=path)
    if options.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, WorkerError):
        return exc.transient
    if isinstance(exc, aiohttp.ClientSSLError):
        return False  # an untrusted certificate stays untrusted
    return isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError)


def _status_error(status: int, url: str) -> WorkerError:
    msg = f"HTTP {status} from {url}"
    if status in (404, 410):
        return SourceNotFound(msg)
    if status in (401, 403):
        return SourceForbidden(msg)
    return SourceUnavailable(msg, transient=status in _TRANSIENT_STATUS)


class HttpSource:
    def __init__(self, options: HttpOptions) -> None:
        self.options = options
        self._session: aiohttp.ClientSession | None = None
        self.resumed = 0  # cuts continued with a Range request
        self.restarted = 0  # cuts where the server sent the whole body again
        self.cuts = 0
        self.info = SourceInfo(size=None, ranges=False)
        self.parallel = False  # whether the last stream() used parallel ranges

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"User-Agent": USER_AGENT, **dict(self.options.headers)}
            if self.options.username is not None:
                # aiohttp drops Authorization on a redirect to another origin: credentials
                # go only to the host the user named.
                headers["Authorization"] = aiohttp.encode_basic_auth(
                    self.options.username, self.options.password or ""
                )
            self._session = aiohttp.ClientSession(
                headers=headers,
                auto_decompress=False,
                read_bufsize=CHUNK_SIZE,
                connector=aiohttp.TCPConnector(ssl=ssl_context(self.options)),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=60, sock_read=self.options.read_timeout
                ),
            )
        return self._session

    async def probe(self) -> SourceInfo:
        """A HEAD hint; many servers refuse or misreport HEAD, so failure means 'unknown'."""
        try:
            async with self._client().head(
                self.options.url,
                allow_redirects=True,
                proxy=self.options.proxy.for_url(self.options.url),
            ) as resp:
                if resp.status != 200:
                    return self.info
                self.info = SourceInfo(
                    size=resp.content_length,
                    ranges=resp.headers.get("Accept-Ranges", "").lower() == "bytes",
                    validator=resp.headers.get("ETag") or resp.headers.get("Last-Modified"),
                )
                return self.info
        except (TimeoutError, aiohttp.ClientError):
            return SourceInfo(size=None, ranges=False)

    async def _open(self, start: int, end: int | None = None) -> aiohttp.ClientResponse:
        try:
            return await self._open_with_retries(start, end)
        except aiohttp.ClientSSLError as exc:
            raise SourceUnavailable(
                f"TLS to {self.options.url} failed: {exc}; provide the server's CA "
                "(certConfigMap, --ca) or set insecureSkipVerify",
                transient=False,
            ) from exc

    async def _open_with_retries(self, start: int, end: int | None) -> aiohttp.ClientResponse:
        headers = {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
        if not start and end is None:
            headers = {}
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.options.attempts),
            wait=wait_exponential_jitter(
                multiplier=self.options.backoff_initial,
                max=self.options.backoff_max,
                jitter=self.options.backoff_initial,
            ),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                resp = await self._client().get(
                    self.options.url,
                    headers=headers,
                    proxy=self.options.proxy.for_url(self.options.url),
                )
                if resp.status not in (200, 206):
                    resp.release()
                    raise _status_error(resp.status, self.options.url)
                return resp
        raise AssertionError("unreachable")

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        """Bytes from ``start`` to the end. One streamed GET first; if the server allows
        ranges and that connection turns out slow (a per-connection limit, a long fat
        network), the rest comes over parallel ranged connections. On a fast path the single
        stream is cheapest, so it is kept."""
        size, opts = self.info.size, self.options
        self.parallel = False
        can_split = bool(opts.connections > 1 and self.info.ranges and size)
        received = start
        single = self._single(start)
        began = time.monotonic()
        try:
            async for chunk in single:
                received += len(chunk)
                yield chunk
                if can_split and received - start >= opts.probe_bytes:
                    can_split = False  # decide once
                    rate = (received - start) / max(time.monotonic() - began, 1e-6)
                    assert size is not None
                    if rate < opts.parallel_below and size - received >= 2 * opts.segment_size:
                        self.parallel = True
                        break
        finally:
            await single.aclose()
        if not self.parallel:
            return
        assert size is not None
        try:
            async for chunk in parallel_ranges(
                self._fetch_range,
                size,
                received,
                connections=opts.connections,
                segment=opts.segment_size,
            ):
                yield chunk
                received += len(chunk)
        except RangesUnsupported:  # HEAD promised ranges, GET disagrees: carry on in one stream
            self.parallel = False
            async for chunk in self._single(received):
                yield chunk

    async def _fetch_range(self, start: int, end: int) -> list[bytes]:
        """One segment as the chunks that arrived (no copy), resumed from its last byte if the
        connection is cut."""
        pieces: list[bytes] = []
        got = 0
        while got < end - start:
            try:
                resp = await self._open(start + got, end)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise SourceUnavailable(f"cannot reach {self.options.url}: {exc}") from exc
            try:
                expected = f"bytes {start + got}-{end - 1}/"
                if resp.status != 206 or not resp.headers.get("Content-Range", "").startswith(
                    expected
                ):
                    raise RangesUnsupported()
                async for chunk in resp.content.iter_chunked(CHUNK_SIZE):
                    pieces.append(chunk)
                    got += len(chunk)
            except _CUT as exc:
                await self._before_resume(exc, start + got)
            finally:
                resp.release()
        if got > end - start:
            raise SourceUnavailable(f"{self.options.url} sent more bytes than the range asked")
        return pieces

    async def _single(self, start: int) -> AsyncGenerator[bytes, None]:
        received = start
        total: int | None = None
        while True:
            try:
                resp = await self._open(received)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise SourceUnavailable(f"cannot reach {self.options.url}: {exc}") from exc
            skip = self._skip_for(resp, received)
            if total is None and resp.content_length is not None:
                total = (
                    received + resp.content_length if resp.status == 206 else (resp.content_length)
                )
            try:
                async for chunk in resp.content.iter_chunked(CHUNK_SIZE):
                    if skip:
                        drop = min(skip, len(chunk))
                        chunk, skip = chunk[drop:], skip - drop
                        if not chunk:
                            continue
                    received += len(chunk)
                    yield chunk
            except _CUT as exc:
                await self._before_resume(exc, received)
                continue
            finally:
                resp.release()
            if total is not None and received < total:
                await self._before_resume(EOFError("body ended early"), received)
                continue
            return

    def _skip_for(self, resp: aiohttp.ClientResponse, received: int) -> int:
        """Bytes to discard from this response to continue at ``received``."""
        if not received:
            return 0
        if resp.status == 206:
            content_range = resp.headers.get("Content-Range", "")
            if content_range.startswith(f"bytes {received}-"):
                self.resumed += 1
                return 0
        self.restarted += 1  # full body again: read past what we already have
        return received

    async def _before_resume(self, exc: BaseException, received: int) -> None:
        self.cuts += 1
        if self.cuts > self.options.resumes:
            raise SourceUnavailable(
                f"connection to {self.options.url} broke {self.options.resumes} times; "
                f"last at byte {received}: {exc}"
            )
        await asyncio.sleep(min(self.options.backoff_max, self.options.backoff_initial))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
