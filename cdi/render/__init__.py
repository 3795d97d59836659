"""Pure renderers: (DataVolume, StorageProfile, CDIConfig) -> the desired PVC and importer Pod.

Nothing here talks to a cluster. The reconciler reads state, calls these, and hands the result
to a thin apply layer, so everything about *what* we create is testable as plain dict equality.
"""

from __future__ import annotations

from cdi.api.constants import ConditionReason


class RenderError(ValueError):
    """The DataVolume cannot be turned into objects yet. ``reason`` becomes the event/condition
    reason verbatim (``ErrClaimNotValid`` as in CDI); the message says what to fix."""

    def __init__(self, message: str, reason: str = ConditionReason.ERR_CLAIM_NOT_VALID) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
