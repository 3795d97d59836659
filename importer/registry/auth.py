"""Registry authentication: the ``WWW-Authenticate`` challenge and what answers it.

A registry says how it wants to be asked on the first 401: ``Basic`` (send the Secret's
credentials) or ``Bearer realm=...,service=...,scope=...`` (get a token from the realm, with the
credentials if we have any, anonymously if not; docker's token protocol). Parsing is pure and
separate from the exchange (``challenge``), so its corner cases are unit-tested without a
network. The realm is a URL the registry names: it is fetched through the same client as the
registry (so the import network policy and the trust settings hold for it too), and an https
registry may not send us to an http realm with credentials.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

from importer.registry.errors import ImagePullFailed

MAX_TOKEN_BYTES = 64 * 1024
_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?')


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer" (lower case)
    params: dict[str, str] = field(default_factory=dict)


def challenge(header: str) -> Challenge | None:
    """The first challenge of a ``WWW-Authenticate`` value; None when there is none."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        if not m or m.end() == pos:
            break
        quoted, bare = m.group(2), m.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare or ""
        params[m.group(1).lower()] = value
        pos = m.end()
    return Challenge(scheme.lower(), params)


def token_url(found: Challenge, repository: str, registry_scheme: str) -> str:
    """Where to ask for a pull token for ``repository``."""
    realm = found.params.get("realm", "")
    unusable = ImagePullFailed(f"the registry names an unusable token realm {realm[:100]!r}")
    try:
        parts = urlsplit(realm)
        _ = parts.port  # out of range or not a number: refused here, not deep in the client
    except ValueError as exc:  # "https://[::1": an unclosed IPv6 literal (found by fuzzing)
        raise unusable from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise unusable
    if registry_scheme == "https" and parts.scheme == "http":
        raise ImagePullFailed("the registry names an http token realm for an https registry")
    query = {"scope": f"repository:{repository}:pull"}
    if found.params.get("service"):
        query = {"service": found.params["service"], **query}
    sep = "&" if parts.query else "?"
    return f"{realm}{sep}{urlencode(query)}"


def token_from(body: bytes) -> str:
    """The token of a token server's JSON answer (``token``, or OAuth2's ``access_token``)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nesting
        raise ImagePullFailed("the token server's answer is not JSON") from exc
    token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
    if not isinstance(token, str) or not token or any(c in token for c in "\r\n\0 "):
        raise ImagePullFailed("the token server's answer holds no usable token")
    return token
