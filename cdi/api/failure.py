"""A worker's last line: any failure at all ends as a typed termination message.

Shared by the workers (importer, uploader; the cloner later), which may not import each other.
A typed ``WorkerError`` already carries a reason and a message fit for the DataVolume. Anything
else is a bug, and its text cannot be shown: an exception message or traceback may hold a source
URL with its credentials or a signed query. So the termination message gets the reason
``InternalError`` and a fixed message naming the worker, and the traceback goes to the pod log
only, with URL userinfo and query strings redacted.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable

from cdi.api.errors import InternalError, WorkerError
from cdi.api.redact import redact_text
from cdi.api.termination import TerminationMessage


def internal_message(worker: str) -> str:
    return f"the {worker} failed unexpectedly; the pod log has the details"


def failure_message(
    exc: BaseException, log: logging.Logger, worker: str = "importer"
) -> TerminationMessage:
    """The termination message for ``exc``; an untyped one is logged (redacted) first."""
    if isinstance(exc, WorkerError):
        return TerminationMessage(reason=exc.reason, message=exc.message, transient=exc.transient)
    text = "".join(traceback.format_exception(exc))
    log.error("unexpected failure:\n%s", redact_text(text))
    return TerminationMessage(reason=InternalError.reason, message=internal_message(worker))


async def guarded(
    work: Callable[[], Awaitable[TerminationMessage]],
    termination_path: str | None,
    log: logging.Logger,
    worker: str = "importer",
) -> TerminationMessage:
    """Run ``work``; whatever it raises becomes a failed, typed termination message (written
    to ``termination_path``, as ``work`` writes its own result on success)."""
    try:
        return await work()
    except Exception as exc:
        message = failure_message(exc, log, worker)
        if termination_path:
            message.write(termination_path)
        return message
