"""GCS source (``source.gcs``): the HTTP source on the object's media URL, with a Bearer token.

A GCS object download is an HTTP GET of the JSON API's media URL
(``<endpoint>/storage/v1/b/<bucket>/o/<url-encoded object>?alt=media``), which honours
``Range``; so this is a thin layer over ``HttpSource`` (ranged parallel reads, resume of a cut
body, every format and compression, proxies, the import network policy on every dial).

URL forms, as CDI documents them:

* ``gs://bucket/object``: on the endpoint, ``https://storage.googleapis.com`` unless the
  importer's configuration names another (``IMPORTER_GCS_ENDPOINT``, rendered from CDIConfig
  ``spec.gcsEndpoint`` by the controller and never from tenant input, or, for ``cdi import``,
  ``STORAGE_EMULATOR_HOST``, the variable Google's client libraries read);
* ``https://storage.googleapis.com/bucket/object`` (and the browser host
  ``storage.cloud.google.com``, which only redirects to a sign-in page for a program, so it is
  read from ``storage.googleapis.com``), or any ``http(s)://host[:port]/bucket/object``: the
  URL's own host is the endpoint.

Credentials: with a ``secretRef`` the Secret's ``credentials.json`` (a service-account key, as
CDI mounts it at ``/google``) is exchanged for an access token by the standard OAuth 2.0
JWT-bearer grant (RFC 7523): an RS256 JWT signed with the account's private key, POSTed to its
``token_uri``. The token is fetched when the first request is sent, cached, and fetched again a
minute before it expires, so an import that outlives it carries a fresh one. The token POST is
dialled through the same policy-checking dialer and TLS trust as the download. No Secret: no
``Authorization`` header (a public object).

Failures: a 404 is ``SourceNotFound`` naming bucket and object; 401/403 from the endpoint or a
refusal from the token endpoint is ``SourceForbidden`` naming who refused and its ``error``
code, never the key, the JWT or the token.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import quote, urlencode, urlsplit

from cdi.api.errors import (
    InvalidConfig,
    SourceForbidden,
    SourceNotFound,
    SourceUnavailable,
    WorkerError,
)
from cdi.api.gcs import DEFAULT_GCS_ENDPOINT, BadGcsEndpoint, parse_gcs_endpoint
from cdi.api.redact import redact_url
from importer.sources.http import HttpOptions, HttpSource
from importer.sources.http_client import Dialer, Exchange, Resolver, system_resolver

DEFAULT_ENDPOINT = DEFAULT_GCS_ENDPOINT
DEFAULT_TOKEN_URI = "https://oauth2.googleapis.com/token"
READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_LIFETIME = 3600  # seconds: the most Google grants for a self-signed assertion
REFRESH_MARGIN = 60.0  # fetch a new token this long before the old one expires
ERROR_BODY_LIMIT = 16 * 1024
_BROWSER_HOSTS = frozenset({"storage.cloud.google.com"})
_ERROR_CODE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class GcsLocation:
    """Where an object is: ``object_url`` is its media URL, ``endpoint`` what messages name."""

    endpoint: str
    bucket: str
    name: str
    object_url: str


def emulator_endpoint(host: str | None) -> str:
    """The endpoint gs:// URLs are read from: CDIConfig ``spec.gcsEndpoint`` as the pod env
    carries it (``IMPORTER_GCS_ENDPOINT``), or ``STORAGE_EMULATOR_HOST`` as Google's libraries
    read it (``host:port`` means http); ``InvalidConfig`` for anything else
    (``cdi.api.gcs.parse_gcs_endpoint``)."""
    try:
        return parse_gcs_endpoint(host)
    except BadGcsEndpoint as exc:
        raise InvalidConfig(f"GCS endpoint {redact_url(host or '')} {exc}") from None


def parse_gcs_url(url: str, endpoint: str = DEFAULT_ENDPOINT) -> GcsLocation:
    """Split a ``source.gcs.url`` (see the module doc); one that names no bucket or no
    object is a typed ``InvalidConfig``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError as exc:
        raise InvalidConfig(f"GCS URL {redact_url(url)} does not parse") from exc
    shape = "want gs://bucket/object or https://storage.googleapis.com/bucket/object"
    if parts.scheme == "gs":
        bucket, name = host, parts.path.lstrip("/")
        base = endpoint
    elif parts.scheme in ("http", "https") and host:
        bucket, _, name = parts.path.lstrip("/").partition("/")
        if host.lower() in _BROWSER_HOSTS:
            base = DEFAULT_ENDPOINT
        else:
            netloc = f"[{host}]" if ":" in host else host
            base = f"{parts.scheme}://{netloc}" + (f":{port}" if port is not None else "")
    else:
        raise InvalidConfig(f"GCS URL {redact_url(url)}: {shape}")
    if not bucket or not name or name.endswith("/"):
        raise InvalidConfig(f"GCS URL {redact_url(url)} names no object: {shape}")
    media = f"{base}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?alt=media"
    return GcsLocation(endpoint=base, bucket=bucket, name=name, object_url=media)


@dataclass(frozen=True)
class ServiceAccount:
    """What the JWT-bearer grant needs from a service-account key file."""

    client_email: str
    private_key: str = field(repr=False)
    private_key_id: str = ""
    token_uri: str = DEFAULT_TOKEN_URI


def service_account(text: str) -> ServiceAccount:
    """Parse a ``credentials.json``; errors say which field, never any value."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidConfig("GCS secretRef: credentials.json is not JSON") from exc
    if not isinstance(data, dict):
        raise InvalidConfig("GCS secretRef: credentials.json is not a JSON object")
    if data.get("type", "service_account") != "service_account":
        raise InvalidConfig("GCS secretRef: credentials.json is not a service-account key")
    for key in ("client_email", "private_key"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise InvalidConfig(f"GCS secretRef: credentials.json has no {key}")
    token_uri = data.get("token_uri") or DEFAULT_TOKEN_URI
    if not isinstance(token_uri, str) or urlsplit(token_uri).scheme not in ("http", "https"):
        raise InvalidConfig("GCS secretRef: credentials.json's token_uri is not http(s)")
    return ServiceAccount(
        client_email=data["client_email"],
        private_key=data["private_key"],
        private_key_id=str(data.get("private_key_id") or ""),
        token_uri=token_uri,
    )


@dataclass(frozen=True)
class GcsOptions:
    """``url`` as the user wrote it (the checkpoint's source identity); ``endpoint`` where
    gs:// URLs are read; ``http`` the trust, proxy, policy and tuning of the HTTP source."""

    url: str
    account: ServiceAccount | None = None  # None: anonymous (a public object)
    endpoint: str = DEFAULT_ENDPOINT
    http: HttpOptions = field(default_factory=lambda: HttpOptions(url=""))


def gcs_options(
    url: str, account: ServiceAccount | None, http: HttpOptions, endpoint: str = DEFAULT_ENDPOINT
) -> GcsOptions:
    """Options for ``url``, checked now so a bad URL fails before any connection."""
    location = parse_gcs_url(url, endpoint)
    plain = replace(http, url=location.object_url, username=None, password=None)
    return GcsOptions(url=url, account=account, endpoint=endpoint, http=plain)


def signed_assertion(account: ServiceAccount, now: float) -> str:
    """The RS256 JWT of the JWT-bearer grant for read-only storage access."""
    claims = {
        "iss": account.client_email,
        "scope": READ_SCOPE,
        "aud": account.token_uri,
        "iat": int(now),
        "exp": int(now) + TOKEN_LIFETIME,
    }
    headers = {"kid": account.private_key_id} if account.private_key_id else None
    import jwt  # here, not at the top: PyJWT and cryptography cost every importer ~35 ms

    try:
        return jwt.encode(claims, account.private_key, algorithm="RS256", headers=headers)
    except (ValueError, TypeError, jwt.PyJWTError) as exc:
        raise InvalidConfig(
            "GCS secretRef: credentials.json's private_key is not an RSA private key in PEM"
        ) from exc


class TokenSource:
    """Access tokens for one service account, fetched on demand and cached (thread-safe:
    the HTTP source signs from its worker threads)."""

    def __init__(
        self,
        account: ServiceAccount,
        http: HttpOptions,
        tls: Callable[[], ssl.SSLContext],
        *,
        resolve: Resolver = system_resolver,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.account = account
        self.http = http
        self._tls = tls
        self._dialer = Dialer(http.policy, resolve)
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0.0
        self.fetched = 0

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._expires - REFRESH_MARGIN:
                self._token, lifetime = self._fetch(now)
                self._expires = now + lifetime
                self.fetched += 1
            return self._token

    def _connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.account.token_uri)
        host, port = parts.hostname or "", parts.port
        timeout = self.http.connect_timeout
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                host,
                port or 443,
                timeout=timeout,
                context=self._tls(),
            )
        else:
            conn = http.client.HTTPConnection(host, port or 80, timeout=timeout)
        origin = f"{parts.scheme}://{parts.netloc}"

        def dial(address: tuple[str, int], timeout: float | None, *_: object) -> object:
            return self._dialer.connect(address[0], address[1], timeout, origin)

        conn._create_connection = dial  # type: ignore[attr-defined]
        return conn

    def _fetch(self, now: float) -> tuple[str, float]:
        """One JWT-bearer grant (blocking): the token and its lifetime in seconds."""
        uri = self.account.token_uri
        shown = redact_url(uri)
        body = urlencode(
            {"grant_type": JWT_BEARER, "assertion": signed_assertion(self.account, now)}
        )
        parts = urlsplit(uri)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._connection()
        try:
            conn.request(
                "POST",
                target,
                body=body,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            response = conn.getresponse()
            raw = response.read(ERROR_BODY_LIMIT)
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            raise SourceUnavailable(f"GCS token endpoint {shown}: {exc}", transient=True) from exc
        finally:
            conn.close()
        try:
            data = json.loads(raw)
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        if status != 200:
            said = _oauth_error(data)
            who = f"service account {self.account.client_email}"
            message = f"GCS token endpoint {shown} refused {who} (HTTP {status}{said})"
            if status in (400, 401, 403):
                raise SourceForbidden(
                    f"{message}: check the secretRef's credentials.json (the key may be "
                    "revoked or the account disabled)"
                )
            raise SourceUnavailable(message, transient=True)
        token = data.get("access_token")
        if not isinstance(token, str) or not token:
            raise SourceUnavailable(
                f"GCS token endpoint {shown} answered no access_token", transient=True
            )
        lifetime = data.get("expires_in", TOKEN_LIFETIME)
        return token, float(lifetime) if isinstance(lifetime, int | float) else TOKEN_LIFETIME


def _oauth_error(data: Mapping[str, object]) -> str:
    """``: <error>`` of an OAuth error body when it is a plain code (RFC 6749 5.2); the
    description is left out: it is free text a server may fill with what it was sent."""
    code = data.get("error")
    return f": {code}" if isinstance(code, str) and _ERROR_CODE.match(code) else ""


class GcsSource(HttpSource):
    """``HttpSource`` on the object's media URL, each request with a Bearer token."""

    def __init__(self, options: GcsOptions, *, resolve: Resolver = system_resolver) -> None:
        self.location = parse_gcs_url(options.url, options.endpoint)
        account = options.account
        self.tokens: TokenSource | None = None
        signer = None
        if account is not None:
            tokens = TokenSource(account, options.http, self._tls_context, resolve=resolve)
            self.tokens = tokens

            def signer(method: str, url: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {tokens.token()}"}

        super().__init__(
            replace(options.http, url=self.location.object_url), signer=signer, resolve=resolve
        )
        self.gcs = options

    def _refusal(self, exchange: Exchange) -> WorkerError:
        loc, status = self.location, exchange.status
        said = f"GCS endpoint {loc.endpoint} answered HTTP {status}"
        if status in (404, 410):
            return SourceNotFound(f"{said} for bucket {loc.bucket!r}, object {loc.name!r}")
        if status in (401, 403):
            hint = (
                ": the object is not public; give a secretRef with a service account's "
                "credentials.json"
                if self.gcs.account is None
                else ": check that the secretRef's service account may read the object"
            )
            return SourceForbidden(f"{said} for bucket {loc.bucket!r}{hint}")
        error = super()._refusal(exchange)
        return type(error)(f"{said} for bucket {loc.bucket!r}", transient=error.transient)
