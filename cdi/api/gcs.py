"""The GCS endpoint ``gs://`` URLs are read from, as the operator names it.

Not in CDI (issue 27): CDI's importer always reads ``gs://bucket/object`` from Google. CDIConfig
``spec.gcsEndpoint`` names another (a private GCS-compatible service, or the emulator the tests
use); the controller renders it into the importer's env (``IMPORTER_GCS_ENDPOINT``) and the
importer reads ``gs://`` URLs there. It is the operator's setting, never a tenant's: a
DataVolume's ``https://host/bucket/object`` URL names its own host and is read there, so a
tenant gains nothing by choosing an endpoint, and the endpoint is still dialled through the
import network policy like any source. One parser, here, for the controller (which refuses
a bad value before rendering a pod) and the importer.
"""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_GCS_ENDPOINT = "https://storage.googleapis.com"


class BadGcsEndpoint(ValueError):
    """Not ``http(s)://host[:port]``; the message quotes no part of the value."""


def parse_gcs_endpoint(text: str | None) -> str:
    """``http(s)://host[:port]`` (a trailing ``/`` allowed) as the origin requests go to;
    ``host:port`` alone means http, as ``STORAGE_EMULATOR_HOST`` does for Google's libraries.
    Empty or None: Google's endpoint. Userinfo, a path, a query or a fragment are refused:
    credentials come from the service account, and the JSON API lives at the root."""
    if not text:
        return DEFAULT_GCS_ENDPOINT
    url = text if "://" in text else f"http://{text}"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        raise BadGcsEndpoint("is not http(s)://host[:port]") from None
    if parts.scheme not in ("http", "https") or not host:
        raise BadGcsEndpoint("is not http(s)://host[:port]")
    if "@" in parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise BadGcsEndpoint("must be http(s)://host[:port] alone (no user, path or query)")
    netloc = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{netloc}" + (f":{port}" if port is not None else "")
