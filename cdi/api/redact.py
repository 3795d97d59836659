"""Redaction of secrets that ride in URLs, for every message a tenant or a log can see.

A source URL may carry credentials in its userinfo (``https://user:pass@host/``) and, more often,
in its query string (pre-signed S3/GCS URLs, ``?token=...``). Termination messages become
DataVolume conditions and events that anyone with read access to the namespace sees, and logs
are read by operators: neither may hold those secrets. One helper, used wherever a URL is put
into text, keeps the scheme, host, port and path (what a user needs to recognise the source)
and replaces the rest with a fixed marker, so a redacted message never depends on the secret's
length or content.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MARK = "REDACTED"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """``url`` without its userinfo and query (and fragment): ``https://REDACTED@host/p?REDACTED``.
    Text that does not parse as a URL is redacted whole rather than echoed."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return MARK
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    if "@" in parts.netloc:
        netloc = f"{MARK}@{netloc}"
    query = MARK if parts.query else ""
    fragment = MARK if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (for messages that quote a foreign error)."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
