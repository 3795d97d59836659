"""The worker pod engine's verdict (``cdi.controller.workerpod.assess``): a pod is ours only by
the UID recorded from our create, an impostor is never read, and our pod's restarts and
termination message are read the same way for every worker (importer, upload server, clone
source, poller)."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.termination import TerminationMessage
from cdi.controller.workerpod import Trust, assess

T0 = "2026-01-01T00:00:00Z"
DONE = TerminationMessage(reason="Completed", message="Import Complete", bytes_written=42)
TOO_LARGE = TerminationMessage(reason="ImageTooLarge", message="too large", transient=False)


def ended(msg: TerminationMessage | None, code: int = 0, reason: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"exitCode": code, "finishedAt": T0}
    if msg is not None:
        out["message"] = msg.to_json()
    if reason:
        out["reason"] = reason
    return out


def pod(
    phase: str = "Running",
    *,
    uid: str = "u1",
    container: str = "importer",
    ready: bool = False,
    terminated: dict[str, Any] | None = None,
    restarts: int = 0,
    last: dict[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    state = {"terminated": terminated} if terminated else {"running": {}}
    cs: dict[str, Any] = {"name": container, "state": state, "restartCount": restarts}
    if last:
        cs["lastState"] = {"terminated": last}
    meta: dict[str, Any] = {"name": "importer-disk", "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = T0
    return {
        "metadata": meta,
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": str(ready)}],
            "containerStatuses": [cs],
        },
    }


def test_nothing_at_the_name_is_absent() -> None:
    seen = assess(None, "u1")
    assert (seen.trust, seen.pod, seen.impostor) == (Trust.ABSENT, None, None)
    assert assess(None, None).trust == Trust.ABSENT


def test_the_pod_with_the_recorded_uid_is_ours() -> None:
    seen = assess(pod(ready=True), "u1")
    assert seen.trust == Trust.OURS and seen.ours
    assert seen.pod is not None and seen.impostor is None
    assert (seen.phase, seen.ready, seen.deleting, seen.finished) == ("Running", True, False, False)


@pytest.mark.parametrize("recorded", ["u2", None, ""])
def test_any_other_pod_at_the_name_is_an_impostor(recorded: str | None) -> None:
    theirs = pod(uid="u1")
    seen = assess(theirs, recorded)
    assert seen.trust == Trust.IMPOSTOR and not seen.ours
    assert (seen.pod, seen.impostor) == (None, theirs)


def test_an_impostor_is_never_read() -> None:
    """Its success, restarts and readiness decide nothing: the verdict carries none of them."""
    forged = pod(
        "Succeeded", uid="theirs", ready=True, terminated=ended(DONE), restarts=3, last=ended(DONE)
    )
    seen = assess(forged, "ours")
    assert seen.trust == Trust.IMPOSTOR
    assert (seen.phase, seen.ready, seen.restarts) == (None, False, 0)
    assert (seen.outcome, seen.last_restart) == (None, None)


def test_a_pod_without_a_uid_is_not_ours_even_with_nothing_recorded() -> None:
    anonymous = pod()
    del anonymous["metadata"]["uid"]
    assert assess(anonymous, None).trust == Trust.IMPOSTOR


def test_our_finished_pod_gives_its_typed_termination_message() -> None:
    seen = assess(pod("Succeeded", terminated=ended(DONE)), "u1")
    assert seen.finished and seen.outcome is not None
    assert seen.outcome.succeeded and seen.outcome.finished_at == T0
    assert seen.outcome.termination is not None and seen.outcome.termination.bytes_written == 42

    failed = assess(pod("Failed", terminated=ended(TOO_LARGE, 1)), "u1").outcome
    assert failed is not None
    assert (failed.reason, failed.message, failed.transient) == (
        "ImageTooLarge",
        "too large",
        False,
    )


def test_a_pod_that_exits_without_a_message_is_no_success() -> None:
    outcome = assess(pod("Succeeded", terminated=ended(None, reason="Completed")), "u1").outcome
    assert outcome is not None and not outcome.succeeded and outcome.transient


def test_a_running_pod_has_no_outcome_yet() -> None:
    seen = assess(pod("Pending"), "u1")
    assert (seen.phase, seen.outcome, seen.ready) == ("Pending", None, False)
    no_status = {"metadata": {"name": "importer-disk", "uid": "u1"}}
    assert assess(no_status, "u1").phase == "Pending"


def test_restarts_and_how_the_last_run_ended() -> None:
    typed = assess(pod(restarts=2, last=ended(TOO_LARGE, 1)), "u1")
    assert typed.restarts == 2
    assert typed.last_restart is not None and typed.last_restart.reason == "ImageTooLarge"

    killed = assess(pod(restarts=1, last=ended(None, 137, reason="OOMKilled")), "u1")
    assert killed.last_restart is not None
    assert (killed.restarts, killed.last_restart.reason) == (1, "OOMKilled")

    fresh = assess(pod(), "u1")
    assert (fresh.restarts, fresh.last_restart) == (0, None)


def test_only_the_named_container_is_read() -> None:
    server = pod(
        "Failed", container="cdi-upload-server", terminated=ended(TOO_LARGE, 1), restarts=4
    )
    as_upload = assess(server, "u1", "cdi-upload-server")
    assert as_upload.restarts == 4
    assert as_upload.outcome is not None and as_upload.outcome.reason == "ImageTooLarge"
    as_importer = assess(server, "u1")  # another container's statuses are not the importer's
    assert as_importer.restarts == 0
    assert as_importer.outcome is not None and as_importer.outcome.termination is None


def test_a_pod_being_deleted_says_so() -> None:
    assert assess(pod(deleting=True), "u1").deleting
