"""HTTP(S) source: one streamed GET that survives the servers people actually run.

Handled here, once: HEAD refused or lying (we only use it as a hint), no ``Accept-Ranges``, wrong
``Content-Type`` (the format is sniffed from content), no ``Content-Length``, transient 5xx/429
(bounded, jittered retries with tenacity before any body byte is used), and a connection cut
mid-body: we resume with ``Range: bytes=N-``; a server that answers a range request with a full
200 is read again from the start with the first N bytes discarded, a bounded number of times.
An error status never yields a body byte, so an error page is never written as an image.

The exchanges themselves are blocking ``http.client`` calls on worker threads
(``importer.sources.http_client`` says why); this module keeps the async ``Source`` face the
phase machine drives, and reads the next chunk while the previous one is handed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import ssl
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from cdi.api.errors import (
    SourceForbidden,
    SourceNotFound,
    SourceUnavailable,
    WorkerError,
)
from cdi.api.httpchange import Validators
from cdi.api.netpolicy import NetPolicy
from cdi.api.redact import redact_text, redact_url
from datapath.sources import SourceInfo
from importer.sources.http_client import (
    Client,
    ConnectionPool,
    Dialer,
    Exchange,
    RequestSigner,
    Resolver,
    basic_auth,
    system_resolver,
    userinfo_authorization,
    without_userinfo,
)
from importer.sources.ranges import RangesUnsupported, parallel_ranges

T = TypeVar("T")
USER_AGENT = "cdi-py-importer"
# What a connection cut mid-body looks like (SSLError: a TLS stream that ends uncleanly).
_CUT = (TimeoutError, ConnectionError, http.client.HTTPException, ssl.SSLError, OSError)
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
    headers: tuple[tuple[str, str], ...] = ()  # plain extra headers: sent on every hop
    secret_headers: tuple[tuple[str, str], ...] = ()  # from Secrets: the named origin only
    username: str | None = None
    password: str | None = None
    ca_files: tuple[str, ...] = ()
    insecure: bool = False
    # importProxy.trustedCAProxy (``/proxycerts/``): trusted for an https:// proxy's TLS (and,
    # as in CDI, also among ``ca_files`` for the destination's)
    proxy_ca_files: tuple[str, ...] = ()
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    # Which addresses may be reached; the default refuses loopback and private ranges too.
    policy: NetPolicy = field(default_factory=NetPolicy)
    connections: int = 4  # parallel ranged connections when the server supports ranges
    segment_size: int = 8 * 1024 * 1024
    probe_bytes: int = 32 * 1024 * 1024  # the single stream's rate is judged after this much
    # bytes/s: a slower single stream switches to parallel. Loopback gives 1.5-3 GB/s on one
    # connection, 0.5-1 GB/s while the decoder and writers compete for 2 cores (splitting
    # cannot help then); a per-connection limit (nginx limit_rate, a WAN path) shows up below.
    parallel_below: float = 400e6
    attempts: int = 5  # per request, for transient statuses and connection errors
    resumes: int = 10  # mid-body cuts survived per import
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    connect_timeout: float = 60.0
    read_timeout: float = 600.0  # CDI's idle watchdog: no byte for 10 minutes


def ssl_context(options: HttpOptions) -> ssl.SSLContext:
    """The system trust store plus the user's CAs, or no verification when asked."""
    ctx = ssl.create_default_context()
    for path in options.ca_files:
        ctx.load_verify_locations(cafile=path)
    if options.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def proxy_ssl_context(options: HttpOptions) -> ssl.SSLContext:
    """An https:// proxy's trust: the system's CAs plus importProxy.trustedCAProxy, always
    verified (``insecureSkipVerify`` is about the source, not the operator's proxy)."""
    ctx = ssl.create_default_context()
    for path in options.proxy_ca_files:
        ctx.load_verify_locations(cafile=path)
    return ctx


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, WorkerError):
        return exc.transient
    if isinstance(exc, ssl.SSLCertVerificationError):
        return False  # an untrusted certificate stays untrusted
    return isinstance(exc, OSError | http.client.HTTPException)


def _rate(got: float, waited: float, first: float, first_wait: float) -> float:
    """Bytes per second of waiting, leaving out the first chunk (connection set-up, TCP slow
    start) when there is more to judge by."""
    if got > first:
        got, waited = got - first, waited - first_wait
    return got / max(waited, 1e-6)


def _validators_of(exchange: Exchange, length: int | None) -> Validators:
    return Validators(
        etag=exchange.header("ETag").strip(),
        last_modified=exchange.header("Last-Modified").strip(),
        content_length=length,
    )


def _status_error(status: int, url: str) -> WorkerError:
    msg = f"HTTP {status} from {redact_url(url)}"
    if status in (404, 410):
        return SourceNotFound(msg)
    if status in (401, 403):
        return SourceForbidden(msg)
    return SourceUnavailable(msg, transient=status in _TRANSIENT_STATUS)


class HttpSource:
    """``signer`` authenticates each request (the S3 source's SigV4); ``resolve`` replaces the
    system resolver of the policy-checking dialer (tests give names an address)."""

    def __init__(
        self,
        options: HttpOptions,
        *,
        signer: RequestSigner | None = None,
        resolve: Resolver = system_resolver,
    ) -> None:
        self.options = options
        self.resumed = 0  # cuts continued with a Range request
        self.restarted = 0  # cuts where the server sent the whole body again
        self.cuts = 0
        self.info = SourceInfo(size=None, ranges=False)
        self.parallel = False  # whether the last stream() used parallel ranges
        self._lock = threading.Lock()
        self._open_exchanges: set[Exchange] = set()
        self._tls: ssl.SSLContext | None = None
        self._proxy_tls: ssl.SSLContext | None = None
        self._pool = ThreadPoolExecutor(options.connections + 1, thread_name_prefix="http")
        self._connections = ConnectionPool()
        self._shown = redact_url(options.url)  # the URL as messages may show it
        headers = {"User-Agent": USER_AGENT, **dict(options.headers)}
        self._client = Client(
            url=without_userinfo(options.url),
            headers=headers,
            authorization=(
                basic_auth(options.username, options.password or "")
                if options.username is not None
                else userinfo_authorization(options.url)
            ),
            tls=self._tls_context,
            proxy_tls=self._proxy_tls_context,
            proxy_for=options.proxy.for_url,
            origin_headers=dict(options.secret_headers),
            dialer=Dialer(options.policy, resolve),
            connect_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
            pool=self._connections,
            signer=signer,
        )

    def _tls_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._tls is None:
                self._tls = ssl_context(self.options)
            return self._tls

    def _proxy_tls_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._proxy_tls is None:
                self._proxy_tls = proxy_ssl_context(self.options)
            return self._proxy_tls

    def _run(self, fn: Callable[..., T], *args: object) -> Awaitable[T]:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def probe(self) -> SourceInfo:
        """A HEAD hint; many servers refuse or misreport HEAD, so failure means 'unknown'."""
        try:
            self.info = await self._run(self._probe)
        except (OSError, http.client.HTTPException, WorkerError):
            self.info = SourceInfo(size=None, ranges=False)
        return self.info

    def _probe(self) -> SourceInfo:
        exchange = self._client.open("HEAD")
        try:
            if exchange.status != 200:
                return SourceInfo(size=None, ranges=False)
            return SourceInfo(
                size=exchange.content_length,
                ranges=exchange.header("Accept-Ranges").lower() == "bytes",
                validator=exchange.header("ETag") or exchange.header("Last-Modified") or None,
            )
        finally:
            exchange.close()

    async def validators(self) -> Validators:
        """What the server says about the image's version, without its body (a DataImportCron
        poll): a HEAD, or a one-byte ranged GET where HEAD is refused, through the same client,
        dialer and policy as an import."""
        return await self._run(self._validators)

    def _validators(self) -> Validators:
        head = self._guarded(lambda: self._client.open("HEAD"))
        try:
            if head.status == 200:
                return _validators_of(head, head.content_length)
        finally:
            head.close()
        exchange = self._open(0, 1)  # HEAD refused or unsupported: bytes=0-0
        try:
            if exchange.status == 206:
                total = exchange.header("Content-Range").rpartition("/")[2]
                return _validators_of(exchange, int(total) if total.isdigit() else None)
            return _validators_of(exchange, exchange.content_length)  # the whole body: unread
        finally:
            self._release(exchange)

    async def fetch_document(self, limit: int) -> bytes:
        """A small document (a checksum file, a stream's JSON) read whole, at most ``limit``
        bytes; a longer body is refused without reading past the limit."""
        return await self._run(self._fetch_document, limit)

    def _fetch_document(self, limit: int) -> bytes:
        exchange = self._open(0)
        try:
            pieces: list[bytes] = []
            got = 0
            while chunk := exchange.read_chunk():
                pieces.append(chunk)
                got += len(chunk)
                if got > limit:
                    raise SourceUnavailable(
                        f"{self._shown} is over {limit} bytes: not the document expected",
                        transient=False,
                    )
            return b"".join(pieces)
        finally:
            self._release(exchange)

    def _guarded(self, fn: Callable[[], Exchange]) -> Exchange:
        """One exchange with the transport's errors typed as ``_open`` types them."""
        try:
            return fn()
        except ssl.SSLCertVerificationError as exc:
            raise SourceUnavailable(f"TLS to {self._shown} failed: {exc}", transient=False) from exc
        except (OSError, http.client.HTTPException) as exc:
            detail = redact_text(str(exc))
            raise SourceUnavailable(f"cannot reach {self._shown}: {detail}") from exc

    def _open(self, start: int, end: int | None = None) -> Exchange:
        """A 200/206 response for ``[start, end)`` after bounded retries (blocking)."""
        try:
            exchange = self._open_with_retries(start, end)
        except ssl.SSLCertVerificationError as exc:
            raise SourceUnavailable(
                f"TLS to {self._shown} failed: {exc}; provide the server's CA "
                "(certConfigMap, --ca) or set insecureSkipVerify",
                transient=False,
            ) from exc
        except http.client.InvalidURL as exc:  # its text quotes the path and query
            raise SourceUnavailable(f"{self._shown} is not a valid URL", transient=False) from exc
        except (OSError, http.client.HTTPException) as exc:
            detail = redact_text(str(exc))
            raise SourceUnavailable(f"cannot reach {self._shown}: {detail}") from exc
        with self._lock:
            self._open_exchanges.add(exchange)
        return exchange

    def _open_with_retries(self, start: int, end: int | None) -> Exchange:
        headers = {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
        if not start and end is None:
            headers = {}
        retrying = Retrying(
            stop=stop_after_attempt(self.options.attempts),
            wait=wait_exponential_jitter(
                multiplier=self.options.backoff_initial,
                max=self.options.backoff_max,
                jitter=self.options.backoff_initial,
            ),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                exchange = self._client.open("GET", headers)
                if exchange.status not in (200, 206):
                    try:
                        raise self._refusal(exchange)
                    finally:
                        exchange.close()
                return exchange
        raise AssertionError("unreachable")

    def _refusal(self, exchange: Exchange) -> WorkerError:
        """The typed error for a response that is not the body (blocking: may read the
        error body; a source that knows its server's error documents says more)."""
        return _status_error(exchange.status, self.options.url)

    def _release(self, exchange: Exchange) -> None:
        with self._lock:
            self._open_exchanges.discard(exchange)
        exchange.close()

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        """Bytes from ``start`` to the end. One streamed GET first; if the server allows
        ranges and that connection turns out slow (a per-connection limit, a long fat
        network), the rest comes over parallel ranged connections. On a fast path the single
        stream is cheapest, so it is kept.

        The rate is judged on the time spent waiting for the network only: while the
        consumer works the next chunk is already being read, so a slow decoder or disk shows
        up as no waiting at all and never triggers a split that could not help. And the
        consumer must have spent less time on its chunks than we spent waiting: an xz decode
        using every core also slows the reading threads (the waiting looks slow), yet more
        connections cannot make the decoder faster, only buffer ~40 MB of segments."""
        size, opts = self.info.size, self.options
        self.parallel = False
        can_split = bool(opts.connections > 1 and self.info.ranges and size)
        received = start
        single = self._single(start)
        waited, began = 0.0, time.monotonic()
        first = first_wait = 0.0  # the first chunk carries the connection set-up
        try:
            while True:
                asked = time.monotonic()
                try:
                    chunk = await anext(single)
                except StopAsyncIteration:
                    break
                waited += time.monotonic() - asked
                if not first:
                    first, first_wait = len(chunk), waited
                received += len(chunk)
                yield chunk
                if can_split and received - start >= opts.probe_bytes:
                    can_split = False  # decide once
                    rate = _rate(received - start, waited, first, first_wait)
                    held = time.monotonic() - began - waited  # by the consumer
                    assert size is not None
                    if (
                        rate < opts.parallel_below
                        and waited > held
                        and size - received >= 2 * opts.segment_size
                    ):
                        self.parallel = True
                        break
        finally:
            await single.aclose()
        if not self.parallel:
            return
        assert size is not None
        try:
            async for chunk in parallel_ranges(
                lambda a, b: self._run(self._fetch_range, a, b),
                size,
                received,
                connections=opts.connections,
                segment=opts.segment_size,
            ):
                yield chunk
                received += len(chunk)
        except RangesUnsupported:  # HEAD promised ranges, GET disagrees: carry on in one stream
            self.parallel = False
            async with contextlib.aclosing(self._single(received)) as rest:
                async for chunk in rest:
                    yield chunk

    def _fetch_range(self, start: int, end: int) -> list[bytes]:
        """One segment as the chunks that arrived, resumed from its last byte if the connection
        is cut (blocking: runs on the pool, one thread per connection)."""
        pieces: list[bytes] = []
        got = 0
        while got < end - start:
            exchange = self._open(start + got, end)
            try:
                expected = f"bytes {start + got}-{end - 1}/"
                if exchange.status != 206 or not exchange.header("Content-Range").startswith(
                    expected
                ):
                    raise RangesUnsupported()
                while chunk := exchange.read_chunk():
                    pieces.append(chunk)
                    got += len(chunk)
                if got < end - start:
                    raise EOFError("segment ended early")
            except (*_CUT, EOFError) as exc:
                time.sleep(self._count_cut(exc, start + got))
            finally:
                self._release(exchange)
        if got > end - start:
            raise SourceUnavailable(f"{self._shown} sent more bytes than the range asked")
        return pieces

    async def _single(self, start: int) -> AsyncGenerator[bytes, None]:
        received = start
        total: int | None = None
        while True:
            exchange = await self._run(self._open, received)
            skip = self._skip_for(exchange, received)
            length = exchange.content_length
            if total is None and length is not None:
                total = received + length if exchange.status == 206 else length
            try:
                async with contextlib.aclosing(self._body(exchange)) as body:
                    async for chunk in body:
                        if skip:
                            drop = min(skip, len(chunk))
                            chunk, skip = chunk[drop:], skip - drop
                            if not chunk:
                                continue
                        received += len(chunk)
                        yield chunk
            except _CUT as exc:
                await asyncio.sleep(self._count_cut(exc, received))
                continue
            if total is not None and received < total:
                await asyncio.sleep(self._count_cut(EOFError("body ended early"), received))
                continue
            return

    async def _body(self, exchange: Exchange) -> AsyncGenerator[bytes, None]:
        """The response body, the next chunk being read while this one is handed on."""
        pending = self._run(exchange.read_chunk)
        try:
            while chunk := await pending:
                pending = self._run(exchange.read_chunk)
                yield chunk
        finally:
            self._release(exchange)  # a read still in flight returns at once
            with contextlib.suppress(BaseException):
                await pending

    def _skip_for(self, exchange: Exchange, received: int) -> int:
        """Bytes to discard from this response to continue at ``received``."""
        if not received:
            return 0
        if exchange.status == 206 and exchange.header("Content-Range").startswith(
            f"bytes {received}-"
        ):
            self.resumed += 1
            return 0
        self.restarted += 1  # full body again: read past what we already have
        return received

    def _count_cut(self, exc: BaseException, received: int) -> float:
        """Charge a cut to the import's budget; return the pause before resuming."""
        with self._lock:
            self.cuts += 1
            cuts = self.cuts
        if cuts > self.options.resumes:
            raise SourceUnavailable(
                f"connection to {self._shown} broke {self.options.resumes} times; "
                f"last at byte {received}: {redact_text(str(exc))}"
            )
        return min(self.options.backoff_max, self.options.backoff_initial)

    async def close(self) -> None:
        with self._lock:
            exchanges, self._open_exchanges = list(self._open_exchanges), set()
        for exchange in exchanges:
            exchange.close()
        self._connections.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
