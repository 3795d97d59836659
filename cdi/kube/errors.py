"""Our errors for everything the Kubernetes API server can answer, mapped once from HTTP status.

Callers branch on the type (``NotFound``, ``Conflict``, ``Gone``, ...) or on ``transient``,
never on message text. ``reason`` is the API server's machine-readable ``Status.reason``
(``AlreadyExists``, ``Conflict``, ``Expired`` ...) and doubles as the condition/event reason.
"""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """The API server (or the connection to it) failed a request."""

    transient = False

    def __init__(self, message: str, *, status: int = 0, reason: str = "", body: Any = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason or type(self).__name__
        self.body = body if isinstance(body, dict) else {}


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409: a stale resourceVersion, or (``AlreadyExists``) a create of an existing name."""

    transient = True

    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(KubeError):
    """410: the resourceVersion a watch or list asked for is too old; re-list."""


class Invalid(KubeError):
    """422 (or 400): the object breaks the schema or an admission rule."""


class Forbidden(KubeError):
    """403: RBAC or an admission webhook said no."""


class QuotaExceeded(Forbidden):
    """403 from the ResourceQuota admission plugin: the object would take the namespace over
    one of its quotas. Not permanent: it is admitted once the quota is raised or usage drops,
    so a refused create is retried (CDI's ``ErrExceededQuota``)."""


class Unauthorized(KubeError):
    pass


class Unavailable(KubeError):
    """5xx, 429, timeouts and connection errors: worth retrying."""

    transient = True


class NotLeading(KubeError):
    """A write refused before it was sent: this process no longer holds its leader Lease, or
    holds it for too short a time to be sure the write lands before a successor may act
    (``cdi.kube.leader``)."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: Unavailable,
}


# The ResourceQuota admission plugin answers 403 with Status.reason "Forbidden" and no cause
# or detail that sets it apart from an RBAC or webhook refusal; only its message does
# ("pods \"x\" is forbidden: exceeded quota: q, requested: ..., used: ..., limited: ...",
# apiserver/pkg/admission/plugin/resourcequota). CDI matches the same words
# (``ErrQuotaExceeded``). This is the one place that reads a message: callers see the type.
_QUOTA_MARK = "exceeded quota: "


def from_status(status: int, body: Any) -> KubeError:
    """The typed error for an HTTP error status and its (JSON or text) body."""
    data: dict[str, Any] = {}
    if isinstance(body, bytes | str):
        try:
            parsed = json.loads(body or b"{}")
            data = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            data = {"message": body.decode("utf-8", "replace") if isinstance(body, bytes) else body}
    elif isinstance(body, dict):
        data = body
    cls = _BY_STATUS.get(status, Unavailable if status >= 500 or status == 0 else KubeError)
    message = str(data.get("message") or f"HTTP {status}")
    if cls is Forbidden and _QUOTA_MARK in message:
        cls = QuotaExceeded
    return cls(message, status=status, reason=str(data.get("reason") or ""), body=data)
