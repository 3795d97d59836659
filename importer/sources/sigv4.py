"""AWS Signature Version 4 for the S3 source: a small signer on the standard library.

Why not a library: botocore (boto3's core) would add ~80 MB of installed service models and its
own HTTP stack to the importer image for one HMAC chain, and the S3 source must reuse the HTTP
source's connections, ranges, resume, proxy and import network policy rather than a second
client's. SigV4 itself is a fixed recipe (canonical request, string to sign, a derived key, one
HMAC), so it lives here, checked against AWS's published test vectors
(``tests/unit/test_sigv4.py``: the SigV4 test suite's ``get-vanilla`` family and the S3
documentation's GET Object and presigned URL examples).

Two ways to sign, both pure functions of (request, credentials, time):

* ``sign_headers``: the ``Authorization`` header the S3 source sends on every request. It is
  computed per request, at send time, so a retry or a resume hours later is signed afresh and
  no signature ever expires mid-import. ``Range`` is deliberately not signed (S3 does not
  require it), so one signature scheme serves the single stream and every ranged segment.
* ``presign``: a query-string signed URL with a short expiry, for handing a GET to a tool that
  cannot sign (kept for completeness and tested; the URL's ``X-Amz-Signature`` and
  ``X-Amz-Credential`` are secrets, which ``cdi.api.redact`` removes with the whole query).

The payload of a GET or HEAD is empty, so its hash is the SHA-256 of nothing; S3 wants it in
``x-amz-content-sha256`` too.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNRESERVED = "-_.~"  # RFC 3986 unreserved, beside letters and digits (quote's default set)
MAX_PRESIGN_EXPIRY = 7 * 24 * 3600  # S3's limit for SigV4 presigned URLs


@dataclass(frozen=True)
class Credentials:
    """An access key pair; ``repr`` never shows the secret (it may end up in a traceback)."""

    access_key_id: str
    secret_access_key: str

    def __repr__(self) -> str:
        return f"Credentials(access_key_id={self.access_key_id!r}, secret_access_key=...)"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _uri_encode(text: str, *, keep_slash: bool) -> str:
    return quote(text, safe=_UNRESERVED + ("/" if keep_slash else ""))


def canonical_path(path: str) -> str:
    """The canonical URI of an S3 request: each byte outside the unreserved set encoded once
    (S3 does not normalise or double-encode), ``/`` kept. Already-encoded input is decoded
    first, so the wire path and the signed one are the same whatever the user wrote."""
    return _uri_encode(unquote(path or "/"), keep_slash=True)


def canonical_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    encoded = sorted(
        (_uri_encode(k, keep_slash=False), _uri_encode(v, keep_slash=False)) for k, v in pairs
    )
    return "&".join(f"{k}={v}" for k, v in encoded)


def host_header(url: str) -> str:
    """The ``Host`` value for ``url`` as ``http.client`` sends it: the port only when it is not
    the scheme's default, an IPv6 literal in brackets."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    default = 443 if parts.scheme == "https" else 80
    return host if parts.port in (None, default) else f"{host}:{parts.port}"


def _stamp(now: dt.datetime) -> tuple[str, str]:
    moment = now.astimezone(dt.UTC)
    return moment.strftime("%Y%m%dT%H%M%SZ"), moment.strftime("%Y%m%d")


def _signature(
    secret: str,
    scope: tuple[str, str, str],
    amz_date: str,
    canonical_request: str,
) -> str:
    day, region, service = scope
    string_to_sign = "\n".join(
        (
            ALGORITHM,
            amz_date,
            f"{day}/{region}/{service}/aws4_request",
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        )
    )
    key = _hmac(f"AWS4{secret}".encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def _canonical_request(
    method: str, url: str, headers: Mapping[str, str], payload_hash: str
) -> tuple[str, str]:
    """(canonical request, signed header list) for the headers given (names any case)."""
    parts = urlsplit(url)
    lowered = {k.lower(): " ".join(v.split()) for k, v in headers.items()}
    names = sorted(lowered)
    signed = ";".join(names)
    canonical = "\n".join(
        (
            method,
            canonical_path(parts.path),
            canonical_query(parts.query),
            "".join(f"{n}:{lowered[n]}\n" for n in names),
            signed,
            payload_hash,
        )
    )
    return canonical, signed


def sign_headers(
    method: str,
    url: str,
    credentials: Credentials,
    *,
    region: str,
    now: dt.datetime,
    service: str = "s3",
    headers: Mapping[str, str] | None = None,
    payload_hash: str = EMPTY_SHA256,
    content_sha256_header: bool = True,
) -> dict[str, str]:
    """The headers that authenticate ``method url`` (``Host``, ``X-Amz-Date``, for S3
    ``X-Amz-Content-Sha256``, and ``Authorization``); ``headers`` are extra headers to sign
    too. The caller sends all of them unchanged."""
    amz_date, day = _stamp(now)
    out = {"Host": host_header(url), "X-Amz-Date": amz_date}
    if content_sha256_header:
        out["X-Amz-Content-Sha256"] = payload_hash
    canonical, signed = _canonical_request(method, url, {**(headers or {}), **out}, payload_hash)
    signature = _signature(
        credentials.secret_access_key, (day, region, service), amz_date, canonical
    )
    credential = f"{credentials.access_key_id}/{day}/{region}/{service}/aws4_request"
    out["Authorization"] = (
        f"{ALGORITHM} Credential={credential}, SignedHeaders={signed}, Signature={signature}"
    )
    return out


def presign(
    method: str,
    url: str,
    credentials: Credentials,
    *,
    region: str,
    now: dt.datetime,
    expires: int,
    service: str = "s3",
) -> str:
    """``url`` with query-string authentication valid for ``expires`` seconds from ``now``;
    only ``host`` is signed, the payload is ``UNSIGNED-PAYLOAD`` as S3 defines for presigning."""
    if not 1 <= expires <= MAX_PRESIGN_EXPIRY:
        raise ValueError(f"expiry must be 1..{MAX_PRESIGN_EXPIRY} seconds")
    amz_date, day = _stamp(now)
    parts = urlsplit(url)
    credential = f"{credentials.access_key_id}/{day}/{region}/{service}/aws4_request"
    query = [
        *parse_qsl(parts.query, keep_blank_values=True),
        ("X-Amz-Algorithm", ALGORITHM),
        ("X-Amz-Credential", credential),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    unsigned = urlunsplit(
        (parts.scheme, parts.netloc, canonical_path(parts.path), urlencode(query), "")
    )
    canonical, _ = _canonical_request(
        method, unsigned, {"host": host_header(url)}, "UNSIGNED-PAYLOAD"
    )
    signature = _signature(
        credentials.secret_access_key, (day, region, service), amz_date, canonical
    )
    return f"{unsigned}&X-Amz-Signature={signature}"
