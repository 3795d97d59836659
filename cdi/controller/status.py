"""DataVolume status as a pure function of what the reconciler observed, for any flavour.

``compute_status(view, previous, now)`` returns the whole ``status`` object; the reconciler
compares it with what it read and writes it (once) only when it differs. Phases, conditions
and messages follow CDI (reference §1.1). The claim's part of the phase is the same for every
flavour (CDI's ``controller-base`` ``updateStatus``); the worker's part comes from the
flavour's ``FlavourPhases`` (import: ImportScheduled/ImportInProgress; upload:
UploadScheduled/UploadReady; clone: CloneScheduled/CloneInProgress, or a step of its own such
as CSICloneInProgress through ``View.step``):

=====================================  ============================================
observed                               phase
=====================================  ============================================
no PVC / PVC not ours / not renderable Pending
PVC Pending on a WaitForFirstConsumer  WaitForFirstConsumer
class, no immediate-binding request
PVC Pending otherwise (no pod)         Pending
PVC Bound, no worker pod yet           PVCBound
flavour reports a step of its own      that step (``View.step``)
worker pod Pending (or a retry is      ``phases.scheduled`` (ImportScheduled)
waiting for its backoff)
worker pod Running / just finished     ``phases.in_progress`` (ImportInProgress)
record says Succeeded                  Succeeded (progress 100.0%)
record says Failed, or PVC Lost        Failed
=====================================  ============================================

Conditions: ``Bound`` from the PVC; ``Running`` True while the pod runs (its message carries
bytes and rate), else False with the last attempt's reason verbatim; ``Ready`` True only when
Succeeded, False/TransferRunning while the flavour works, False with the failure reason when
Failed. ``Verified`` (ours, issue 28) only on a volume read back after it was filled: True
once Succeeded with the read-back matching, False with ``VerificationNotSupported`` when the
run wrote it in a way the digest does not cover, False with ``VerificationFailed`` when the
read-back differed (the DataVolume is Failed then). A condition's ``lastTransitionTime``
changes only when its ``status`` changes;
``lastHeartbeatTime`` when anything in it changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdi.api.constants import (
    PROGRESS_COMPLETE,
    PROGRESS_NOT_AVAILABLE,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    Phase,
)
from cdi.api.errors import VerificationFailed
from cdi.api.termination import VERIFIED
from cdi.controller.progress import Progress
from cdi.controller.record import OUTCOME_FAILED, OUTCOME_SUCCEEDED, ClaimRecord

Condition = dict[str, Any]


@dataclass(frozen=True)
class ClaimProblem:
    """Why there is no usable PVC: the reason (``ErrClaimNotValid``, ``ErrResourceExists``)
    is the Bound condition's reason and the event's."""

    reason: str
    message: str


@dataclass(frozen=True)
class FlavourPhases:
    """A flavour's own phases (CDI spelling) and the words its conditions use."""

    scheduled: Phase  # worker created, not running yet (or waiting to retry)
    in_progress: Phase  # worker running, or just finished and not yet recorded
    worker: str  # "Importer": "Importer pod pending"
    activity: str  # "Import": "Import in progress"
    running_reason: str = (
        ""  # the Running condition's reason while the worker runs (upload: CDI's "Pod is running")
    )

    def working(self, phase: Phase, step: Phase | None) -> bool:
        return phase in (self.scheduled, self.in_progress) or (step is not None and phase == step)


@dataclass(frozen=True)
class View:
    """Everything the status depends on, gathered by the reconciler and its flavour."""

    claim_name: str
    phases: FlavourPhases
    step: Phase | None = None  # a phase the flavour chose itself (a clone's CSICloneInProgress)
    pvc_phase: str | None = None  # None: no PVC
    waiting_for_consumer: bool = False
    problem: ClaimProblem | None = None
    record: ClaimRecord = field(default_factory=ClaimRecord)
    pod_phase: str | None = None  # of the current attempt's worker pod
    progress: Progress | None = None  # fresh reading, when the pod is running
    retry_in: float | None = None  # seconds until the next attempt's pod is created
    pod_problem: tuple[str, str] | None = None  # (reason, message): why the pod is stuck
    creating_scratch: bool = False  # the import's scratch claim is not bound yet (CDI's words)
    max_attempts: int = 1


def compute_phase(v: View) -> Phase:
    if v.problem is not None or v.pvc_phase is None:
        return Phase.PENDING
    if v.pvc_phase == "Lost" or v.record.outcome == OUTCOME_FAILED:
        return Phase.FAILED
    if v.record.outcome == OUTCOME_SUCCEEDED:
        return Phase.SUCCEEDED
    if v.step is not None:
        return v.step
    if v.pod_phase == "Running" or v.pod_phase in ("Succeeded", "Failed"):
        return v.phases.in_progress
    if v.pod_phase == "Pending" or v.retry_in is not None:
        return v.phases.scheduled
    if v.pvc_phase == "Bound":
        return Phase.PVC_BOUND
    if v.waiting_for_consumer:
        return Phase.WAIT_FOR_FIRST_CONSUMER
    return Phase.PENDING


def _bound(v: View) -> Condition:
    name = v.claim_name
    if v.problem is not None:
        return _cond(ConditionType.BOUND, False, v.problem.reason, v.problem.message)
    if v.pvc_phase is None:
        return _cond(ConditionType.BOUND, False, ConditionReason.NOT_FOUND, "No PVC found")
    if v.creating_scratch:  # CDI overrides the Bound condition so while scratch is made
        reason, message = ConditionReason.CREATING_SCRATCH_SPACE, "Creating scratch space"
        return _cond(ConditionType.BOUND, False, reason, message)
    if v.pvc_phase == "Bound":
        return _cond(ConditionType.BOUND, True, ConditionReason.BOUND, f"PVC {name} Bound")
    if v.pvc_phase == "Lost":
        return _cond(ConditionType.BOUND, False, ConditionReason.CLAIM_LOST, "Claim Lost")
    return _cond(ConditionType.BOUND, False, ConditionReason.PENDING, f"PVC {name} Pending")


def _running(v: View, phase: Phase) -> Condition:
    rec = v.record
    words = v.phases
    if v.pod_problem is not None and phase in (words.scheduled, words.in_progress):
        return _cond(ConditionType.RUNNING, False, *v.pod_problem)
    if phase == words.in_progress and v.pod_phase == "Running":
        activity = words.activity
        message = v.progress.describe(activity) if v.progress else f"{activity} in progress"
        return _cond(ConditionType.RUNNING, True, words.running_reason, message)
    if rec.reason and (phase in (Phase.SUCCEEDED, Phase.FAILED) or v.retry_in is not None):
        message = rec.message or ""
        if phase not in (Phase.SUCCEEDED, Phase.FAILED) and v.retry_in is not None:
            attempt = rec.failed_attempts + 1
            message = (
                f"{message} (attempt {attempt} of {v.max_attempts} in {v.retry_in:.0f}s)"
            ).strip()
        return _cond(ConditionType.RUNNING, False, rec.reason, message)
    if v.pod_phase == "Pending":
        message = f"{words.worker} pod pending"
        return _cond(ConditionType.RUNNING, False, ConditionReason.PENDING, message)
    return _cond(ConditionType.RUNNING, False, "", "")


def _ready(v: View, phase: Phase) -> Condition:
    if phase == Phase.SUCCEEDED:
        return _cond(ConditionType.READY, True, "", "")
    if phase == Phase.FAILED:
        reason = v.record.reason or ConditionReason.CLAIM_LOST
        return _cond(ConditionType.READY, False, reason, v.record.message or "Claim Lost")
    if v.phases.working(phase, v.step):
        return _cond(ConditionType.READY, False, ConditionReason.TRANSFER_RUNNING, "")
    return _cond(ConditionType.READY, False, "", "")


VERIFIED_MESSAGE = "The volume was read back from its device and holds what was written"


def _verified(v: View, phase: Phase) -> Condition | None:
    """The Verified condition, only where verification ran (the module docstring)."""
    rec = v.record
    if phase == Phase.FAILED and rec.reason == VerificationFailed.reason:
        return _cond(ConditionType.VERIFIED, False, rec.reason, rec.message or "")
    if phase != Phase.SUCCEEDED or rec.verification is None:
        return None
    if rec.verification == VERIFIED:
        return _cond(ConditionType.VERIFIED, True, VERIFIED, VERIFIED_MESSAGE)
    return _cond(ConditionType.VERIFIED, False, rec.verification, rec.message or "")


def _cond(type_: str, status: bool, reason: str, message: str) -> Condition:
    return {
        "type": str(type_),
        "status": str(ConditionStatus.TRUE if status else ConditionStatus.FALSE),
        "reason": str(reason),
        "message": message,
    }


def _progress(v: View, phase: Phase, previous: Mapping[str, Any]) -> str:
    if phase == Phase.SUCCEEDED:
        return PROGRESS_COMPLETE
    active = phase in (v.phases.in_progress, v.step)
    if v.progress is not None and active:
        return v.progress.text
    if active or phase == Phase.FAILED:
        return str(previous.get("progress") or PROGRESS_NOT_AVAILABLE)
    return PROGRESS_NOT_AVAILABLE


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], wanted: Sequence[Condition], now: str
) -> list[Condition]:
    """Keep each condition's timestamps unless it changed (transition time: status only)."""
    old = {str(c.get("type")): c for c in previous}
    out: list[Condition] = []
    for cond in wanted:
        prev = old.get(cond["type"])
        merged = dict(cond)
        same_status = prev is not None and prev.get("status") == cond["status"]
        unchanged = same_status and all(
            (prev or {}).get(k, "") == cond[k] for k in ("reason", "message")
        )
        merged["lastTransitionTime"] = (
            (prev or {}).get("lastTransitionTime") or now if same_status else now
        )
        merged["lastHeartbeatTime"] = (
            (prev or {}).get("lastHeartbeatTime") or now if unchanged else now
        )
        out.append(merged)
    return out


def compute_status(view: View, previous: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    prev = dict(previous or {})
    phase = compute_phase(view)
    conditions = [_bound(view), _ready(view, phase), _running(view, phase)]
    verified = _verified(view, phase)
    if verified is not None:
        conditions.append(verified)
    return {
        "claimName": view.claim_name,
        "phase": str(phase),
        "progress": _progress(view, phase, prev),
        "restartCount": view.record.failed_attempts,
        "conditions": merge_conditions(prev.get("conditions") or [], conditions, now),
    }


def status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    return dict(old or {}) != dict(new)
