"""String syntax the DataVolume webhook judges the way Go and Kubernetes do.

CDI checks source URLs with Go's ``net/url.ParseRequestURI`` (http, s3, gcs, imageio, vddk) and
``net/url.Parse`` (registry). To reject exactly the URLs CDI rejects we follow Go's parser on the
points that decide acceptance: control characters, the scheme grammar, "request URI" needing an
absolute path or scheme, host characters and the port. Kubernetes object names (Secrets,
ConfigMaps, priority classes) use its DNS-1123 rules and its error text.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Final

_SCHEME_FIRST: Final = frozenset(string.ascii_letters)
_SCHEME_REST: Final = frozenset(string.ascii_letters + string.digits + "+-.")
_HOST_OK: Final = frozenset(string.ascii_letters + string.digits + "-_.~!$&'()*+,;=:[]<>\"")
_HEX: Final = frozenset(string.hexdigits)

DNS1123_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
# RFC 7230 token: what an HTTP header name may contain.
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class URLError(ValueError):
    """Go's url package would refuse this string."""


@dataclass(frozen=True)
class ParsedURL:
    scheme: str  # lower case, "" when absent
    userinfo: str | None
    host: str  # "" when there is no authority
    opaque: str
    path: str


def parse_request_uri(raw: str) -> ParsedURL:
    """Go's ``url.ParseRequestURI``: absolute URI or absolute path, no fragment splitting."""
    return _parse(raw, via_request=True)


def parse_url(raw: str) -> ParsedURL:
    """Go's ``url.Parse``: the fragment is split off first, relative references are allowed."""
    return _parse(raw.partition("#")[0], via_request=False)


def _parse(raw: str, *, via_request: bool) -> ParsedURL:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise URLError("net/url: invalid control character in URL")
    scheme, rest = _split_scheme(raw)
    rest = rest.partition("?")[0]
    if not rest.startswith("/"):
        if scheme:
            return ParsedURL(scheme, None, "", rest, "")
        if via_request:
            raise URLError("invalid URI for request")
        if ":" in rest.partition("/")[0]:
            raise URLError("first path segment in URL cannot contain colon")
    userinfo, host = None, ""
    if rest.startswith("//") and (scheme or not via_request):
        authority, slash, path = rest[2:].partition("/")
        userinfo, host = _parse_authority(authority)
        rest = slash + path
    _unescape(rest)
    return ParsedURL(scheme, userinfo, host, "", rest)


def _split_scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if c in _SCHEME_FIRST or (c in _SCHEME_REST and i > 0):
            continue
        if c == ":":
            if i == 0:
                raise URLError("missing protocol scheme")
            return raw[:i].lower(), raw[i + 1 :]
        break
    return "", raw


def _parse_authority(authority: str) -> tuple[str | None, str]:
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return None, _check_host(authority)
    _unescape(userinfo)
    return userinfo, _check_host(host)


def _check_host(host: str) -> str:
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            raise URLError("missing ']' in host")
        port = host[end + 1 :]
    else:
        colon = host.rfind(":")
        port = host[colon:] if colon >= 0 else ""
    if port and not (port == ":" or (port[0] == ":" and port[1:].isdigit())):
        raise URLError(f"invalid port {port!r} after host")
    for c in host:
        if c != "%" and ord(c) < 0x80 and c not in _HOST_OK:
            raise URLError(f"invalid character {c!r} in host name")
    _unescape(host)
    return host


def _unescape(text: str) -> None:
    i = 0
    while i < len(text):
        if text[i] == "%":
            digits = text[i + 1 : i + 3]
            if len(digits) < 2 or not set(digits) <= _HEX:
                raise URLError(f"invalid URL escape {text[i : i + 3]!r}")
            i += 3
        else:
            i += 1


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def is_header_line(line: str) -> bool:
    """``Name: value`` with a valid header name (what ``extraHeaders`` entries must be)."""
    name, sep, _ = line.partition(":")
    return bool(sep) and _HEADER_NAME.fullmatch(name) is not None
