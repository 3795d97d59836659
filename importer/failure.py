"""The importer's last line: any failure at all ends as a typed termination message.

The policy is shared by every worker and lives in ``cdi.api.failure`` (the workers may not
import each other): a typed ``WorkerError`` keeps its reason and message; anything else is a
bug that ends as ``InternalError`` with a fixed message, its traceback only in the pod log with
URL userinfo and query strings redacted. This module names the importer in that message.
"""

from __future__ import annotations

from cdi.api.failure import failure_message, guarded, internal_message

INTERNAL_MESSAGE = internal_message("importer")

__all__ = ["INTERNAL_MESSAGE", "failure_message", "guarded"]
