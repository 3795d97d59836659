"""Typed refusals of the upload control plane, each with the HTTP status it is answered with.

The token API and the upload proxy face untrusted callers: every refusal is one of these (a
``WorkerError`` with a machine-readable ``reason``), mapped to a status in exactly one place
per server, never a traceback. Messages are CDI's verbatim where CDI has one, because users
and scripts match on them; they are HTML-escaped when written (``proxy.py``).
"""

from __future__ import annotations

from cdi.api.errors import WorkerError


class UploadError(WorkerError):
    """Base: ``status`` is the HTTP status the caller gets."""

    reason = "UploadFailed"
    status = 500


class BadUploadRequest(UploadError):
    """No or malformed ``Authorization`` header, or a token that is not an upload token."""

    reason = "BadRequest"
    status = 400


class InvalidToken(UploadError):
    """Bad signature, unknown key, wrong issuer, expired, or bound to another PVC incarnation."""

    reason = "InvalidToken"
    status = 401


class UploadNotReady(UploadError):
    """The PVC is missing, not an upload target, already done, or its upload pod not ready."""

    reason = "UploadNotReady"
    status = 503
    transient = True


class UploadServerUnreachable(UploadError):
    """The upload server pod's Service could not be reached (CDI's reverse-proxy 502)."""

    reason = "UploadServerUnreachable"
    status = 502
    transient = True


class UploadInterrupted(UploadError):
    """The uploader's body stopped: idle for too long, or its connection was cut."""

    reason = "UploadInterrupted"
    status = 408
    transient = True


class UnknownSigningKey(InvalidToken):
    """The token names a key we do not have (yet): worth reloading the keys once."""
