"""What an admission check returns: causes shaped like ``metav1.StatusCause``, plus warnings.

Kept apart from the rules so the rule modules (``validation``, ``sources``) and the webhook
server that turns a verdict into an ``AdmissionResponse`` share one small vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CauseType(StrEnum):
    """``metav1.CauseType`` values CDI uses."""

    INVALID = "FieldValueInvalid"
    DUPLICATE = "FieldValueDuplicate"
    NOT_FOUND = "FieldValueNotFound"


@dataclass(frozen=True)
class Cause:
    """One reason for rejection: the message users read, the field it is about."""

    message: str
    field: str = ""
    type: CauseType = CauseType.INVALID


Causes = list[Cause]


@dataclass(frozen=True)
class ValidationResult:
    """Allowed when there are no causes; warnings travel either way."""

    causes: tuple[Cause, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.causes

    @property
    def messages(self) -> list[str]:
        return [c.message for c in self.causes]
