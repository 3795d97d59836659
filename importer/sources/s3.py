"""S3 source (``source.s3``): the HTTP source with SigV4 on every request.

An S3 GetObject is an HTTP GET, so this is a thin layer: the URL is split into endpoint, bucket
and key (``parse_s3_url``), the object's URL is handed to ``HttpSource`` unchanged in every
other respect (ranged parallel reads, resume of a cut body, proxies, the certConfigMap's CAs,
the import network policy on every dial), and each request is signed at send time with the
access key pair from the DataVolume's ``secretRef`` (``sigv4.sign_headers``). Signing per
request rather than presigning once means a retry or a resume hours later never carries an
expired signature, and no signature ever sits in a URL that a message could quote.

URL forms, as CDI documents them:

* path-style ``http(s)://host[:port]/bucket/key`` (MinIO, Ceph RGW, ``s3.<region>.amazonaws.com``),
  what CDI's client uses for every endpoint (``S3ForcePathStyle``);
* virtual-hosted ``https://bucket.s3.<region>.amazonaws.com/key``: a host with an ``s3`` or
  ``s3-<region>`` label after the first one names the bucket in the labels before it (also
  ``bucket.s3.amazonaws.com`` and other providers that copy AWS's scheme, and dotted bucket
  names). A path-style URL on such a host would be ambiguous, so virtual-hosted wins there.

The signing region is the one AWS's host names carry (``s3.<region>.``, ``s3-<region>.``);
anything else is signed for ``us-east-1``, which MinIO, Ceph and versitygw accept by default.
An endpoint that wants another region says so: S3's ``AuthorizationHeaderMalformed`` refusal
carries ``<Region>``, and the source signs again for that region, once (CDI signs a non-AWS
endpoint for its host's first label and fails there). If HEAD (which has no error body) was
refused, a one-byte ranged GET learns the region before the import starts, so the size and
ranges are known and parallel reads stay possible.

Failures say what the endpoint said: S3 puts a machine-readable ``<Code>`` in its error
documents (``NoSuchKey``, ``NoSuchBucket`` -> ``SourceNotFound``; ``InvalidAccessKeyId``,
``SignatureDoesNotMatch``, ``AccessDenied`` -> ``SourceForbidden``, permanent). Only that code
is quoted, never the rest of the document: ``SignatureDoesNotMatch`` echoes the string to sign
and the access key id, and messages become conditions and events a namespace reader sees.
"""

from __future__ import annotations

import datetime as dt
import http.client
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

from cdi.api.errors import (
    InvalidConfig,
    SourceForbidden,
    SourceNotFound,
    SourceUnavailable,
    WorkerError,
)
from cdi.api.redact import redact_url
from datapath.sources import SourceInfo
from importer.sources.http import HttpOptions, HttpSource
from importer.sources.http_client import Exchange, Resolver, system_resolver
from importer.sources.sigv4 import Credentials, canonical_path, sign_headers

DEFAULT_REGION = "us-east-1"
ERROR_BODY_LIMIT = 16 * 1024  # an S3 error document is < 1 KiB; never read a large body
_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")
_REGION = re.compile(rb"<Region>([a-z0-9-]{1,32})</Region>")
_S3_LABEL = re.compile(r"^s3(?:-(?P<region>[a-z0-9-]+))?$")
_AWS_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchVersion"})


@dataclass(frozen=True)
class S3Location:
    """Where an object is: ``object_url`` is what goes on the wire (its path encoded the way it
    is signed), ``endpoint`` what messages name."""

    endpoint: str
    bucket: str
    key: str
    region: str
    virtual_host: bool
    object_url: str


def _region(labels: list[str], at: int) -> str:
    """The region an AWS host name carries after its ``s3`` label (``s3-<region>`` or
    ``s3.<region>.``), else the default."""
    own = _S3_LABEL.match(labels[at])
    if own and own.group("region") and _AWS_REGION.match(own.group("region")):
        return own.group("region")
    following = labels[at + 1] if at + 1 < len(labels) else ""
    return following if _AWS_REGION.match(following) else DEFAULT_REGION


def parse_s3_url(url: str) -> S3Location:
    """Split a ``source.s3.url`` into its parts (see the module doc); a URL that names no
    bucket or no object is a typed ``InvalidConfig``."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError as exc:
        raise InvalidConfig(f"S3 URL {redact_url(url)} does not parse") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidConfig(f"S3 URL {redact_url(url)}: want http(s)://host/bucket/object")
    labels = host.split(".")
    at = next((i for i in range(1, len(labels)) if _S3_LABEL.match(labels[i])), None)
    path = parts.path.lstrip("/")
    if at is not None:
        bucket, key, region = ".".join(labels[:at]), path, _region(labels, at)
    else:
        bucket, _, key = path.partition("/")
        s3_at = next((i for i, label in enumerate(labels) if _S3_LABEL.match(label)), None)
        region = _region(labels, s3_at) if s3_at is not None else DEFAULT_REGION
    if not bucket or not key or key.endswith("/"):
        raise InvalidConfig(
            f"S3 URL {redact_url(url)} names no object: want "
            "http(s)://host/bucket/object or https://bucket.s3.<region>.amazonaws.com/object"
        )
    netloc = host if ":" not in host else f"[{host}]"
    netloc += f":{port}" if port is not None else ""
    endpoint = urlunsplit((parts.scheme, netloc, "", "", ""))
    wire_path = canonical_path("/" + (key if at is not None else f"{bucket}/{key}"))
    return S3Location(
        endpoint=endpoint,
        bucket=bucket,
        key=key,
        region=region,
        virtual_host=at is not None,
        object_url=urlunsplit((parts.scheme, netloc, wire_path, parts.query, "")),
    )


@dataclass(frozen=True)
class S3Options:
    """``url`` as the user wrote it (the checkpoint's source identity); ``http`` carries the
    trust, proxy, policy and tuning the HTTP source uses, its URL the object's."""

    url: str
    credentials: Credentials | None = None  # None: anonymous (a public object), unsigned
    http: HttpOptions = field(default_factory=lambda: HttpOptions(url=""))


def s3_options(url: str, credentials: Credentials | None, http: HttpOptions) -> S3Options:
    """Options for ``url``, checked now so a bad URL fails before any connection."""
    location = parse_s3_url(url)
    plain = replace(http, url=location.object_url, username=None, password=None)
    return S3Options(url=url, credentials=credentials, http=plain)


Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def error_code(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document, if it has a plain one."""
    found = _CODE.search(body)
    return found.group(1).decode("ascii") if found else None


def error_region(body: bytes) -> str | None:
    """The ``<Region>`` an ``AuthorizationHeaderMalformed`` refusal asks for, if plain."""
    found = _REGION.search(body)
    return found.group(1).decode("ascii") if found else None


class S3Source(HttpSource):
    """``HttpSource`` on the object's URL, each request signed; S3's error codes named."""

    def __init__(
        self,
        options: S3Options,
        *,
        clock: Clock = _utcnow,
        resolve: Resolver = system_resolver,
    ) -> None:
        self.location = parse_s3_url(options.url)
        self.region = self.location.region  # replaced once if the endpoint asks another
        self.region_learned = False
        creds = options.credentials

        def signer(method: str, url: str) -> dict[str, str]:
            assert creds is not None
            return sign_headers(method, url, creds, region=self.region, now=clock())

        super().__init__(
            replace(options.http, url=self.location.object_url),
            signer=signer if creds is not None else None,
            resolve=resolve,
        )
        self.s3 = options

    async def probe(self) -> SourceInfo:
        info = await super().probe()
        if info.size is None and self.s3.credentials is not None and not self.region_learned:
            if await self._run(self._learn_region):
                info = await super().probe()
        return info

    def _learn_region(self) -> bool:
        """One signed ``Range: bytes=0-0`` GET: its refusal's ``<Region>``, if any, is taken
        (blocking). Whatever else goes wrong is left for the import to meet and report."""
        try:
            exchange = self._client.open("GET", {"Range": "bytes=0-0"})
        except (OSError, http.client.HTTPException, WorkerError):
            return False
        try:
            if exchange.status not in (200, 206):
                self._refusal(exchange)
        finally:
            exchange.close()
        return self.region_learned

    def _refusal(self, exchange: Exchange) -> WorkerError:
        try:
            body = exchange.response.read(ERROR_BODY_LIMIT)
        except (OSError, http.client.HTTPException):
            body = b""
        code = error_code(body)
        if code is None:
            return super()._refusal(exchange)
        loc, status = self.location, exchange.status
        said = f"S3 endpoint {loc.endpoint} answered {code} (HTTP {status})"
        wanted = error_region(body) if code == "AuthorizationHeaderMalformed" else None
        if wanted and wanted != self.region and not self.region_learned:
            signed, self.region, self.region_learned = self.region, wanted, True
            return SourceUnavailable(
                f"{said}: signed for region {signed}, it wants {wanted}; signing again",
                transient=True,
            )
        if code in _NOT_FOUND_CODES or status == 404:
            return SourceNotFound(f"{said} for bucket {loc.bucket!r}, object {loc.key!r}")
        if status in (401, 403):
            hint = (
                ""
                if self.s3.credentials is None
                else ": check the secretRef's accessKeyId and secretKey"
            )
            return SourceForbidden(f"{said} for bucket {loc.bucket!r}{hint}")
        error = super()._refusal(exchange)
        return type(error)(f"{said} for bucket {loc.bucket!r}", transient=error.transient)
