"""The failure policy and the reading of importer pods' termination messages."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.termination import TerminationMessage
from cdi.controller.policy import Decision, FailurePolicy, Outcome, pod_outcome
from cdi.controller.record import ClaimRecord


def pod(phase: str, message: str = "", reason: str = "Error", exit_code: int = 1) -> dict:
    terminated: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason,
        "finishedAt": "2026-01-01T00:00:05Z",
    }
    if message:
        terminated["message"] = message
    state = {"terminated": terminated} if phase in ("Succeeded", "Failed") else {"running": {}}
    return {"status": {"phase": phase, "containerStatuses": [{"name": "importer", "state": state}]}}


def msg(reason: str, transient: bool = False) -> str:
    return TerminationMessage(
        reason=reason, message=f"{reason} happened", transient=transient
    ).to_json()


def test_running_pod_has_no_outcome() -> None:
    assert pod_outcome(pod("Running")) is None
    assert pod_outcome({"status": {"phase": "Pending"}}) is None


def test_typed_message_gives_reason_and_transience() -> None:
    out = pod_outcome(pod("Failed", msg("SourceUnavailable", transient=True)))
    assert out is not None
    assert (out.reason, out.transient, out.finished_at) == (
        "SourceUnavailable",
        True,
        "2026-01-01T00:00:05Z",
    )
    ok = pod_outcome(pod("Succeeded", msg("Completed"), reason="Completed", exit_code=0))
    assert ok is not None and ok.succeeded


def test_pod_without_a_typed_message_is_a_transient_error_with_the_container_reason() -> None:
    out = pod_outcome(pod("Failed", "Traceback...\nMemoryError", reason="OOMKilled"))
    assert out is not None
    assert (out.reason, out.transient) == ("OOMKilled", True)
    assert "MemoryError" in out.message


def test_exit_zero_without_completed_message_is_not_success() -> None:
    out = pod_outcome(pod("Succeeded", "", reason="Completed", exit_code=0))
    assert out is not None and not out.succeeded


@pytest.mark.parametrize(
    ("reason", "transient", "failed_before", "decision"),
    [
        ("Completed", False, 0, Decision.SUCCEED),
        ("Completed", False, 2, Decision.SUCCEED),
        ("ChecksumMismatch", False, 0, Decision.FAIL),
        ("UnsafeImage", False, 0, Decision.FAIL),
        ("InsufficientSpace", False, 0, Decision.FAIL),
        ("SourceNotFound", False, 0, Decision.FAIL),
        ("SourceUnavailable", True, 0, Decision.RETRY),
        ("SourceUnavailable", True, 1, Decision.RETRY),
        ("SourceUnavailable", True, 2, Decision.FAIL),  # third attempt was the last
    ],
)
def test_transient_errors_retry_up_to_the_limit_permanent_ones_fail_at_once(
    reason: str, transient: bool, failed_before: int, decision: Decision
) -> None:
    outcome = Outcome(reason, "m", transient)
    assert FailurePolicy(max_attempts=3).decide(outcome, failed_before) == decision


def test_retry_delay_doubles_and_is_capped() -> None:
    policy = FailurePolicy(base_delay=2.0, max_delay=5.0)
    assert [policy.retry_delay(n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 5.0, 5.0]


def test_import_record_round_trips_through_pvc_annotations() -> None:
    record = ClaimRecord(
        failed_attempts=2,
        outcome="Failed",
        reason="UnsafeImage",
        message="backing file",
        pod_name="importer-x-retry-2",
    )
    pvc = {"metadata": {"annotations": {k: v for k, v in record.annotations().items() if v}}}
    assert ClaimRecord.from_pvc(pvc) == record
    assert not record.differs_from(pvc)
    assert ClaimRecord.from_pvc(None) == ClaimRecord()


def test_failed_pod_phase_without_fatal_error_is_not_terminal() -> None:
    pvc = {"metadata": {"annotations": {"cdi.kubevirt.io/storage.pod.phase": "Failed"}}}
    assert not ClaimRecord.from_pvc(pvc).done
