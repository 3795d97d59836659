"""What to do after an import attempt ends: succeed, retry later, or fail for good.

CDI restarts a failed importer forever (kubelet CrashLoopBackOff); only a checksum mismatch is
terminal. We decide from the worker's typed termination message instead: a ``transient`` error
is retried with exponential backoff up to ``max_attempts`` pods in all; anything else
(checksum mismatch, unsafe or unsupported image, not enough space, 404) fails at once. The
reason in the message becomes the condition reason verbatim; nothing here reads message text.

A pod that died without a JSON termination message (killed, OOM, crashed before writing it)
carries the container's terminated ``reason`` (``Error``, ``OOMKilled``) and counts as
transient: the attempt limit still bounds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cdi.api.constants import IMPORTER_CONTAINER_NAME, ConditionReason
from cdi.api.termination import (
    REASON_COMPLETED,
    VERIFICATION_NOT_SUPPORTED,
    VERIFIED,
    TerminationMessage,
)

REASON_NO_MESSAGE = "Error"


@dataclass(frozen=True)
class Outcome:
    """How one finished importer pod ended."""

    reason: str
    message: str
    transient: bool
    finished_at: str | None = None
    termination: TerminationMessage | None = None

    @property
    def succeeded(self) -> bool:
        return self.reason == REASON_COMPLETED


def verification_of(outcome: Outcome) -> str | None:
    """What a successful worker said of reading its volume back (``Verification.result``),
    for the claim record; None when it was not asked to."""
    term = outcome.termination
    if term is None or term.verification is None:
        return None
    result = term.verification.result
    return result if result in (VERIFIED, VERIFICATION_NOT_SUPPORTED) else None


class Decision(StrEnum):
    SUCCEED = "Succeed"
    RETRY = "Retry"
    FAIL = "Fail"


@dataclass(frozen=True)
class FailurePolicy:
    max_attempts: int = 3  # importer pods per DataVolume, the first one included
    base_delay: float = 2.0  # before the second attempt; doubles per attempt
    max_delay: float = 60.0

    def decide(self, outcome: Outcome, failed_before: int) -> Decision:
        """``failed_before``: failed attempts before this one (= its attempt index)."""
        if outcome.succeeded:
            return Decision.SUCCEED
        if outcome.transient and failed_before + 1 < self.max_attempts:
            return Decision.RETRY
        return Decision.FAIL

    def retry_delay(self, failed: int) -> float:
        """Seconds to wait after the ``failed``-th failure (1-based) before the next pod."""
        return float(min(self.max_delay, self.base_delay * 2 ** max(0, failed - 1)))


def pod_outcome(pod: dict[str, Any], container: str = IMPORTER_CONTAINER_NAME) -> Outcome | None:
    """The outcome of a finished worker pod (its ``container``), or None while it runs."""
    status = pod.get("status") or {}
    if status.get("phase") not in ("Succeeded", "Failed"):
        return None
    term = _terminated(status, container)
    text = str(term.get("message") or "")
    finished = term.get("finishedAt")
    try:
        msg = TerminationMessage.from_json(text)
    except (ValueError, TypeError, KeyError):
        msg = None
    if msg is not None:
        # A pod that exits 0 without "Completed" broke the contract; do not call it success.
        if status.get("phase") == "Failed" and msg.succeeded:
            return Outcome(
                REASON_NO_MESSAGE, "importer failed after reporting success", True, finished, msg
            )
        return Outcome(msg.reason, msg.message, msg.transient, finished, msg)
    reason = str(term.get("reason") or status.get("reason") or REASON_NO_MESSAGE)
    if reason == REASON_COMPLETED:
        reason = REASON_NO_MESSAGE  # exited 0 without a message: not a success we can trust
    exit_code = term.get("exitCode")
    detail = text.strip().splitlines()[-1] if text.strip() else f"exit code {exit_code}"
    return Outcome(reason, f"importer pod ended without a result: {detail}"[:1024], True, finished)


def _terminated(status: dict[str, Any], container: str) -> dict[str, Any]:
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == container:
            state = cs.get("state") or {}
            return dict(state.get("terminated") or {})
    return {}


# The kubelet's waiting reasons for an image it cannot pull (any container of the pod: with a
# registry node pull, the containerDisk is the pod's "server" container).
IMAGE_PULL_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
PULL_FAILED_MESSAGE = "failed to pull image"
UNSCHEDULABLE_MESSAGE = "Importer pod cannot be scheduled"


def pod_problem(
    pod: dict[str, Any], unschedulable_message: str = UNSCHEDULABLE_MESSAGE
) -> tuple[str, str] | None:
    """Why a worker pod that has not finished is stuck, as CDI reports it on the Running
    condition: ``ImagePullFailed`` "failed to pull image" (the kubelet's reason for it
    follows), ``Unschedulable`` (``unschedulable_message``: CDI's words for an importer, another
    worker names itself); None when nothing is wrong."""
    status = pod.get("status") or {}
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_WAITING:
            detail = str(waiting.get("message") or waiting["reason"])[:512]
            return ConditionReason.IMAGE_PULL_FAILED, f"{PULL_FAILED_MESSAGE}: {detail}"
    for cond in status.get("conditions") or []:
        unschedulable = cond.get("reason") == ConditionReason.UNSCHEDULABLE
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and unschedulable:
            return ConditionReason.UNSCHEDULABLE, unschedulable_message
    return None
