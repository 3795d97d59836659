"""The blocking registry client: manifests, tokens and small blobs, on the importer's HTTP client.

No registry library fits: the Python ones buffer blobs in memory or bring their own HTTP stack,
which would bypass the import network policy and the redirect rules that
``importer.sources.http_client`` already enforces (credentials only to their origin, no https
to http downgrade, every address checked by the ``Dialer``). So this is the distribution API v2
in ~200 lines on that client: ``GET /v2/<repo>/manifests/<ref>`` and ``/blobs/<digest>``, the
401 challenge answered once (``auth``), bounded bodies, every manifest and blob checked against
its digest. Layer blobs are not read here: ``blob_options`` gives the ``HttpOptions`` that
``HttpSource`` streams them with (retries, resume with ``Range``), the Authorization header being
an origin-only secret header, so a blob redirected to a CDN gets no registry credentials.

Plain http is used only for a registry listed as insecure (CDIConfig ``insecureRegistries``),
and only after https without verification failed to handshake, as the container tools do.
Calls block: ``RegistrySource`` runs them on a worker thread.
"""

from __future__ import annotations

import hashlib
import http.client
import ssl
from dataclasses import dataclass, field, replace

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from cdi.api.errors import SourceForbidden, SourceUnavailable, WorkerError
from cdi.api.redact import redact_text
from importer.registry import auth
from importer.registry.errors import DigestMismatch, ImagePullFailed
from importer.registry.manifest import ACCEPT, MAX_MANIFEST_BYTES
from importer.registry.reference import Reference
from importer.sources.http import USER_AGENT, HttpOptions, proxy_ssl_context, ssl_context
from importer.sources.http_client import Client, ConnectionPool, Dialer, Exchange, basic_auth

_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Fetched:
    status: int
    body: bytes
    content_type: str = ""
    digest_header: str = ""  # Docker-Content-Digest
    challenge: str = ""  # WWW-Authenticate


@dataclass
class RegistryClient:
    """One image's registry, its scheme found and its authorization obtained on first use."""

    ref: Reference
    http: HttpOptions  # trust, proxy, policy, timeouts; ``url`` unused
    username: str | None = None
    password: str | None = None
    plain_http_fallback: bool = False  # an insecure registry may answer on plain http
    scheme: str | None = None
    authorization: str | None = None  # the answer to the registry's challenge, once known
    _pool: ConnectionPool = field(default_factory=ConnectionPool)
    _tls: ssl.SSLContext | None = None
    _proxy_tls: ssl.SSLContext | None = None

    @property
    def base(self) -> str:
        return f"{self.scheme or 'https'}://{self.ref.registry}"

    def close(self) -> None:
        self._pool.close()

    def get(self, path: str, accept: str = "", limit: int = MAX_MANIFEST_BYTES) -> Fetched:
        """GET ``/v2/<repo>/<path>``: answers the challenge once; ImagePullFailed when refused."""
        if self.scheme is None:
            self.scheme = self._find_scheme()
        url = f"{self.base}/v2/{self.ref.repository}/{path}"
        found = self._fetch(url, accept, self.authorization, limit)
        if found.status == 401 and found.challenge:
            self.authorization = self._answer(auth.challenge(found.challenge))
            found = self._fetch(url, accept, self.authorization, limit)
        if found.status in (401, 403):
            who = "with the given credentials" if self.username else "anonymously"
            raise ImagePullFailed(
                f"{self.ref}: the registry refused access {who} (HTTP {found.status})"
            )
        return found

    def manifest(self, reference: str) -> tuple[Fetched, str]:
        """The manifest bytes for a tag or digest and their digest, checked when pinned."""
        found = self.get(f"manifests/{reference}", ACCEPT)
        if found.status == 404:
            raise ImagePullFailed(f"{self.ref}: manifest unknown (no such image or tag)")
        if found.status != 200:
            raise ImagePullFailed(f"{self.ref}: the registry answered HTTP {found.status}")
        digest = "sha256:" + hashlib.sha256(found.body).hexdigest()
        expected = reference if reference.startswith("sha256:") else found.digest_header
        if expected and expected.startswith("sha256:") and expected != digest:
            raise DigestMismatch(f"{self.ref}: the manifest served hashes to {digest}")
        return found, digest

    def blob(self, digest: str, size: int, limit: int = MAX_MANIFEST_BYTES) -> bytes:
        """A small blob (an image config), read whole and checked against its digest."""
        if size > limit:
            raise DigestMismatch(f"blob {digest} declares {size} bytes, more than {limit}")
        found = self.get(f"blobs/{digest}", limit=limit)
        if found.status != 200:
            raise ImagePullFailed(f"{self.ref}: blob {digest}: HTTP {found.status}")
        check_blob(found.body, digest, size)
        return found.body

    def blob_options(self, digest: str) -> HttpOptions:
        """How ``HttpSource`` streams a layer blob: the authorization for its origin only."""
        secret = (("Authorization", self.authorization),) if self.authorization else ()
        url = f"{self.base}/v2/{self.ref.repository}/blobs/{digest}"
        return replace(self.http, url=url, username=None, password=None, secret_headers=secret)

    # -- exchanges ----------------------------------------------------------------------------

    def _find_scheme(self) -> str:
        if not self.plain_http_fallback:
            return "https"
        try:
            self._fetch_once(f"https://{self.ref.registry}/v2/", "", None, 64 * 1024)
        except SourceUnavailable:
            return "http"  # no TLS handshake there: an insecure registry on plain http
        return "https"

    def _answer(self, found: auth.Challenge | None) -> str:
        basic = basic_auth(self.username, self.password or "") if self.username else None
        if found is not None and found.scheme == "bearer":
            url = auth.token_url(found, self.ref.repository, self.scheme or "https")
            answer = self._fetch(url, "application/json", basic, auth.MAX_TOKEN_BYTES)
            if answer.status in (401, 403):
                raise ImagePullFailed(f"{self.ref}: the token server refused the credentials")
            if answer.status != 200:
                raise ImagePullFailed(f"{self.ref}: the token server answered {answer.status}")
            return f"Bearer {auth.token_from(answer.body)}"
        if found is not None and found.scheme == "basic" and basic:
            return basic
        raise ImagePullFailed(f"{self.ref}: the registry requires credentials (secretRef)")

    def _fetch(self, url: str, accept: str, authorization: str | None, limit: int) -> Fetched:
        """One GET with bounded retries for transient failures; the body read up to ``limit``."""
        retrying = Retrying(
            stop=stop_after_attempt(self.http.attempts),
            wait=wait_exponential_jitter(
                multiplier=self.http.backoff_initial,
                max=self.http.backoff_max,
                jitter=self.http.backoff_initial,
            ),
            retry=retry_if_exception(lambda e: isinstance(e, WorkerError) and e.transient),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return self._fetch_once(url, accept, authorization, limit)
        raise AssertionError("unreachable")

    def _fetch_once(self, url: str, accept: str, authorization: str | None, limit: int) -> Fetched:
        headers = {"User-Agent": USER_AGENT, **({"Accept": accept} if accept else {})}
        client = Client(
            url=url,
            headers=headers,
            authorization=authorization,
            tls=self._tls_context,
            proxy_tls=self._proxy_tls_context,
            proxy_for=self.http.proxy.for_url,
            dialer=Dialer(self.http.policy),
            connect_timeout=self.http.connect_timeout,
            read_timeout=self.http.read_timeout,
            pool=self._pool,
        )
        try:
            exchange = client.open("GET")
            try:
                return _fetched(exchange, limit)
            finally:
                exchange.close()
        except ssl.SSLCertVerificationError as exc:
            raise ImagePullFailed(
                f"{self.ref}: TLS certificate not trusted ({exc.verify_message}); provide the "
                "registry's CA (certConfigMap) or list it in insecureRegistries"
            ) from exc
        except (SourceForbidden, WorkerError):
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise SourceUnavailable(
                f"cannot reach {self.ref.registry}: {redact_text(str(exc))}"
            ) from exc

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl_context(self.http)
        return self._tls

    def _proxy_tls_context(self) -> ssl.SSLContext:
        if self._proxy_tls is None:
            self._proxy_tls = proxy_ssl_context(self.http)
        return self._proxy_tls


def _fetched(exchange: Exchange, limit: int) -> Fetched:
    status = exchange.status
    if status in _TRANSIENT_STATUS:
        raise SourceUnavailable(f"the registry answered HTTP {status}")
    body = b""
    if status == 200:
        body = exchange.response.read(limit + 1)
        if len(body) > limit:
            raise ImagePullFailed(f"the registry's answer is larger than {limit} bytes")
    return Fetched(
        status,
        body,
        exchange.header("Content-Type"),
        exchange.header("Docker-Content-Digest"),
        exchange.header("WWW-Authenticate"),
    )


def check_blob(body: bytes, digest: str, size: int) -> None:
    got = "sha256:" + hashlib.sha256(body).hexdigest()
    if got != digest or len(body) != size:
        raise DigestMismatch(f"blob {digest} was served as {len(body)} bytes hashing to {got}")
