"""DataVolume status as a pure function: phases, conditions, progress, transition times."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.controller.flavours.import_ import IMPORT_PHASES
from cdi.controller.progress import Progress
from cdi.controller.record import ClaimRecord
from cdi.controller.status import ClaimProblem, View, compute_status, merge_conditions

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
SUCCEEDED = ClaimRecord(outcome="Succeeded", reason="Completed", message="Import Complete")
FAILED = ClaimRecord(outcome="Failed", reason="ChecksumMismatch", message="sha256 differs")


def importing(**observed: Any) -> View:
    """What the reconciler saw of DataVolume "dv", filled by the import flavour."""
    return View("dv", IMPORT_PHASES, **observed)


def conds(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.parametrize(
    ("view", "phase"),
    [
        (importing(), "Pending"),
        (importing(problem=ClaimProblem("ErrClaimNotValid", "bad")), "Pending"),
        (importing(pvc_phase="Pending"), "Pending"),
        (importing(pvc_phase="Pending", waiting_for_consumer=True), "WaitForFirstConsumer"),
        (
            importing(pvc_phase="Pending", waiting_for_consumer=True, pod_phase="Pending"),
            "ImportScheduled",
        ),
        (importing(pvc_phase="Bound"), "PVCBound"),
        (importing(pvc_phase="Bound", pod_phase="Pending"), "ImportScheduled"),
        (importing(pvc_phase="Bound", pod_phase="Running"), "ImportInProgress"),
        (importing(pvc_phase="Bound", retry_in=3.0), "ImportScheduled"),
        (importing(pvc_phase="Bound", record=SUCCEEDED), "Succeeded"),
        (importing(pvc_phase="Bound", record=FAILED), "Failed"),
        (importing(pvc_phase="Lost"), "Failed"),
    ],
)
def test_phase_follows_claim_pod_and_record(view: View, phase: str) -> None:
    assert compute_status(view, None, T0)["phase"] == phase


def test_success_is_ready_with_full_progress_and_completed_running_reason() -> None:
    status = compute_status(importing(pvc_phase="Bound", record=SUCCEEDED), None, T0)
    c = conds(status)
    assert status["progress"] == "100.0%"
    assert c["Ready"]["status"] == "True"
    assert c["Bound"] == {
        **c["Bound"],
        "status": "True",
        "reason": "Bound",
        "message": "PVC dv Bound",
    }
    assert (c["Running"]["status"], c["Running"]["reason"]) == ("False", "Completed")


def test_failure_is_never_ready_and_carries_the_worker_reason_verbatim() -> None:
    view = importing(pvc_phase="Bound", record=FAILED)
    status = compute_status(view, {"progress": "42.00%"}, T0)
    c = conds(status)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ChecksumMismatch")
    assert c["Running"]["reason"] == "ChecksumMismatch"
    assert c["Running"]["message"] == "sha256 differs"
    assert status["progress"] == "42.00%"  # last known progress stays visible


def test_running_pod_shows_cdi_progress_and_bytes_and_rate() -> None:
    progress = Progress(
        percent=12.3456, bytes_done=3 * 1024**2, bytes_total=24 * 1024**2, rate=1024**2
    )
    status = compute_status(
        importing(pvc_phase="Bound", pod_phase="Running", progress=progress), None, T0
    )
    c = conds(status)
    assert status["progress"] == "12.35%"
    assert c["Running"]["status"] == "True"
    assert c["Running"]["message"] == "Import in progress: 3.0 MiB of 24.0 MiB at 1.0 MiB/s"
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "TransferRunning")


def test_progress_is_not_available_before_the_first_reading() -> None:
    view = importing(pvc_phase="Bound", pod_phase="Running")
    assert compute_status(view, None, T0)["progress"] == "N/A"


def test_retry_waiting_reports_attempt_and_restart_count() -> None:
    record = ClaimRecord(failed_attempts=1, reason="SourceUnavailable", message="503")
    status = compute_status(
        importing(pvc_phase="Bound", record=record, retry_in=2.0, max_attempts=3), None, T0
    )
    assert status["restartCount"] == 1
    running = conds(status)["Running"]
    assert running["reason"] == "SourceUnavailable"
    assert running["message"] == "503 (attempt 2 of 3 in 2s)"


def test_claim_problem_is_the_bound_reason() -> None:
    view = importing(problem=ClaimProblem("ErrResourceExists", "not managed by DataVolume"))
    bound = conds(compute_status(view, None, T0))["Bound"]
    assert (bound["status"], bound["reason"]) == ("False", "ErrResourceExists")


def test_transition_time_changes_only_when_status_changes() -> None:
    first = compute_status(importing(pvc_phase="Bound", pod_phase="Pending"), None, T0)
    # Same statuses, different message/reason in Running: transition time kept.
    second = compute_status(importing(pvc_phase="Bound", pod_phase="Running"), first, T1)
    a, b = conds(first), conds(second)
    assert b["Bound"]["lastTransitionTime"] == T0 and b["Bound"]["lastHeartbeatTime"] == T0
    assert a["Running"]["status"] == "False" and b["Running"]["status"] == "True"
    assert b["Running"]["lastTransitionTime"] == T1
    assert b["Ready"]["lastTransitionTime"] == T0  # False -> False


def test_unchanged_view_gives_an_identical_status_so_nothing_is_written() -> None:
    view = importing(pvc_phase="Bound", record=SUCCEEDED)
    first = compute_status(view, None, T0)
    assert compute_status(view, first, T1) == first


def test_merge_conditions_keeps_heartbeat_until_reason_or_message_changes() -> None:
    prev = [
        {
            "type": "Running",
            "status": "False",
            "reason": "Pending",
            "message": "m",
            "lastTransitionTime": T0,
            "lastHeartbeatTime": T0,
        }
    ]
    same = merge_conditions(
        prev, [{"type": "Running", "status": "False", "reason": "Pending", "message": "m"}], T1
    )
    moved = merge_conditions(
        prev, [{"type": "Running", "status": "False", "reason": "Error", "message": "m"}], T1
    )
    assert same[0]["lastHeartbeatTime"] == T0
    assert moved[0]["lastHeartbeatTime"] == T1 and moved[0]["lastTransitionTime"] == T0
