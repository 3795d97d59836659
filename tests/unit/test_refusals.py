"""A claim or worker pod refused by a ResourceQuota: the DataVolume waits (never Failed) and
says why, on the condition CDI puts it on."""

from __future__ import annotations

from typing import Any

from cdi.controller.flavours.import_ import IMPORT_PHASES
from cdi.controller.refusals import refused_claim, refused_pod
from cdi.controller.status import View, compute_status
from cdi.kube.errors import Forbidden, QuotaExceeded

QUOTA = QuotaExceeded(
    'persistentvolumeclaims "disk" is forbidden: exceeded quota: small, '
    "requested: requests.storage=1Gi, used: requests.storage=0, limited: requests.storage=100Mi",
    status=403,
    reason="Forbidden",
)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_refused_claim_leaves_the_datavolume_pending_with_bound_exceeded_quota() -> None:
    status = compute_status(View("disk", IMPORT_PHASES, problem=refused_claim(QUOTA)), {}, "t")
    assert status["phase"] == "Pending"
    bound = conditions(status)["Bound"]
    assert (bound["status"], bound["reason"]) == ("False", "ErrExceededQuota")
    assert "exceeded quota: small" in bound["message"]


def test_a_refused_worker_pod_is_scheduled_with_running_exceeded_quota() -> None:
    refused = refused_pod("importer-disk", QUOTA)
    view = View("disk", IMPORT_PHASES, pvc_phase="Bound", pod_phase="Pending", pod_problem=refused)
    status = compute_status(view, {}, "t")
    assert status["phase"] == "ImportScheduled"
    running = conditions(status)["Running"]
    assert (running["status"], running["reason"]) == ("False", "ErrExceededQuota")
    assert running["message"].startswith("Error starting pod 'importer-disk': ")
    assert conditions(status)["Bound"]["reason"] == "Bound"


def test_a_pod_refused_by_anything_but_a_quota_is_err_starting_pod() -> None:
    refused = refused_pod("importer-disk", Forbidden("denied by policy", status=403))
    assert refused == ("ErrStartingPod", "Error starting pod 'importer-disk': denied by policy")
