"""The upload flavour's decisions (``assess``: a pure function of the server pod and the UID
recorded) and the DataVolume status they lead to: CDI's phases, conditions and restart count."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.termination import TerminationMessage
from cdi.controller.caches import WORKER_PODS
from cdi.controller.flavours.upload import (
    UPLOAD_PHASES,
    Action,
    assess,
    phase_for,
)
from cdi.controller.flavours.upload import _recorded as recorded
from cdi.controller.record import ClaimRecord
from cdi.controller.status import View, compute_status
from cdi.controller.uploadpvc import is_upload_pod, watches
from cdi.kube.client import PODS
from cdi.kube.watches import Request

T0 = "2026-01-01T00:00:00Z"


def pod(
    phase: str = "Running",
    *,
    uid: str = "u1",
    ready: bool = False,
    terminated: dict[str, Any] | None = None,
    restarts: int = 0,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    state = {"terminated": terminated} if terminated else {"running": {}}
    cs: dict[str, Any] = {"name": "cdi-upload-server", "state": state, "restartCount": restarts}
    if last:
        cs["lastState"] = {"terminated": last}
    return {
        "metadata": {"name": "cdi-upload-disk", "uid": uid},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": str(ready)}],
            "containerStatuses": [cs],
        },
    }


def ended(msg: TerminationMessage, code: int = 0) -> dict[str, Any]:
    return {"exitCode": code, "message": msg.to_json(), "finishedAt": T0}


def test_no_pod_means_create_and_a_pod_not_recorded_is_an_impostor() -> None:
    assert assess(None, None).action == Action.CREATE
    assert assess(pod(uid="theirs"), "u1").action == Action.IMPOSTOR
    assert assess(pod(), None).action == Action.IMPOSTOR  # nothing recorded: not ours


@pytest.mark.parametrize(
    ("observed", "action", "pod_phase"),
    [
        (pod("Pending"), Action.WAIT, "Pending"),
        (pod("Running", ready=False), Action.WAIT, "Pending"),
        (pod("Running", ready=True), Action.READY, "Running"),
    ],
)
def test_upload_ready_only_once_the_pod_is_ready(
    observed: dict[str, Any], action: Action, pod_phase: str
) -> None:
    verdict = assess(observed, "u1")
    assert (verdict.action, phase_for(verdict)) == (action, pod_phase)


def test_a_completed_server_succeeds_with_its_message() -> None:
    msg = TerminationMessage("Completed", "Upload Complete", preallocation_applied=True)
    verdict = assess(pod("Succeeded", terminated=ended(msg)), "u1")
    assert (verdict.action, verdict.reason, verdict.message) == (
        Action.SUCCEED,
        "Completed",
        "Upload Complete",
    )
    assert verdict.preallocation_applied
    assert recorded(ClaimRecord(), verdict).outcome == "Succeeded"


def test_a_passed_deadline_renews_the_pod_instead_of_ending_the_upload() -> None:
    msg = TerminationMessage("DeadlinePassed", "deadlinePassed: certificates due for renewal")
    verdict = assess(pod("Succeeded", terminated=ended(msg)), "u1")
    assert verdict.action == Action.RENEW
    assert recorded(ClaimRecord(), verdict).outcome is None


def test_a_failed_pod_fails_with_the_typed_reason() -> None:
    msg = TerminationMessage("ImageTooLarge", "image is larger than the volume")
    verdict = assess(pod("Failed", terminated=ended(msg, 1)), "u1")
    assert (verdict.action, verdict.reason) == (Action.FAIL, "ImageTooLarge")
    record = recorded(ClaimRecord(), verdict)
    assert (record.outcome, record.reason) == ("Failed", "ImageTooLarge")


def test_a_server_exiting_0_without_a_result_is_no_success() -> None:
    verdict = assess(pod("Succeeded", terminated={"exitCode": 0, "reason": "Completed"}), "u1")
    assert verdict.action == Action.FAIL


def test_restarts_are_counted_with_the_last_reason() -> None:
    last = ended(TerminationMessage("InternalError", "boom", transient=True), 1)
    verdict = assess(pod("Running", ready=True, restarts=2, last=last), "u1")
    assert (verdict.action, verdict.restarts, verdict.reason) == (Action.READY, 2, "InternalError")
    record = recorded(ClaimRecord(failed_attempts=1), verdict)
    assert record.failed_attempts == 2
    assert record.annotations()["cdi.kubevirt.io/storage.pod.restarts"] == "2"


def conds(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_upload_ready_has_cdis_conditions_and_restart_count() -> None:
    verdict = assess(pod("Running", ready=True, restarts=1), "u1")
    view = View(
        "disk",
        UPLOAD_PHASES,
        pvc_phase="Bound",
        pod_phase=phase_for(verdict),
        record=recorded(ClaimRecord(), verdict),
    )
    status = compute_status(view, None, T0)
    c = conds(status)
    assert status["phase"] == "UploadReady"
    assert status["restartCount"] == 1
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "TransferRunning")
    assert (c["Bound"]["status"], c["Bound"]["reason"]) == ("True", "Bound")
    assert (c["Running"]["status"], c["Running"]["reason"]) == ("True", "Pod is running")


def test_a_pod_not_ready_yet_is_upload_scheduled() -> None:
    verdict = assess(pod("Running", ready=False), "u1")
    view = View("disk", UPLOAD_PHASES, pvc_phase="Bound", pod_phase=phase_for(verdict))
    status = compute_status(view, None, T0)
    assert status["phase"] == "UploadScheduled"
    assert conds(status)["Running"]["message"] == "Upload server pod pending"


def test_restarts_never_fail_the_upload_whatever_the_reason() -> None:
    bad = ended(TerminationMessage("UnsupportedFormat", "not a disk image"), 1)
    verdict = assess(pod("Running", ready=False, restarts=1, last=bad), "u1")
    assert (verdict.action, verdict.reason) == (Action.WAIT, "UnsupportedFormat")
    killed = {"exitCode": 137, "reason": "Error", "finishedAt": T0}
    verdict = assess(pod("Running", ready=False, restarts=2, last=killed), "u1")
    assert (verdict.action, verdict.restarts, verdict.reason) == (Action.WAIT, 2, "Error")


def test_an_upload_server_maps_to_its_claims_key_and_is_told_from_importers() -> None:
    server = {
        "metadata": {
            "namespace": "ns",
            "labels": {"cdi.kubevirt.io": "cdi-upload-server"},
            "ownerReferences": [
                {"kind": "PersistentVolumeClaim", "name": "disk", "uid": "p", "controller": True}
            ],
        }
    }
    # the DataVolume of that name, or the plain PVC
    assert watches({}).requests(PODS, server) == [Request("ns/disk")]
    assert is_upload_pod(server)
    importer = {"metadata": {"labels": {"cdi.kubevirt.io": "importer"}}}
    assert not is_upload_pod(importer)
    assert WORKER_PODS == "cdi.kubevirt.io in (importer,cdi-upload-server)"
