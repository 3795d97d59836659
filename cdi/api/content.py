"""One parser for the content type a worker is told (``kubevirt`` when unset, or ``archive``).

The importer (``IMPORTER_CONTENT_TYPE``, ``cdi import --content-type``) and the upload server
(``CONTENT_TYPE``) take the same two DataVolume content types; the clone envelopes are chosen
by other means (the cloner's header), never by this setting. Shared here because the workers
may not import each other.
"""

from __future__ import annotations

from cdi.api.constants import DATAVOLUME_CONTENT_TYPES, ContentType
from cdi.api.errors import InvalidConfig


def parse_content_type(text: str | None, job: str) -> ContentType:
    """A DataVolume content type (kubevirt when unset); anything else is a typed error naming
    ``job`` ("an import", "an upload")."""
    try:
        value = ContentType(text or ContentType.KUBEVIRT)
    except ValueError as exc:
        raise InvalidConfig(f"unknown content type {text!r}") from exc
    if value not in DATAVOLUME_CONTENT_TYPES:
        raise InvalidConfig(f"content type {text!r} is not one {job} can take")
    return value
