"""External population: a DataVolume with no ``source`` or ``sourceRef`` whose ``storage`` (or
``pvc``) names a ``dataSourceRef`` (or ``dataSource``) of another populator's kind.

CDI's external-population controller: the claim is created with that reference (the foreign
populator, or the CSI driver for a PVC or VolumeSnapshot reference, fills it), and the
DataVolume waits for it: ``Pending`` while the claim is unbound (``PendingPopulation`` on
WaitForFirstConsumer storage with no consumer yet), ``Succeeded`` once it is bound, with the
event ``ExternalPopulationSucceeded``. Nothing of ours runs: no worker pod, no record but the
outcome written on the claim when it is bound, so a restarted controller does not repeat the
event. The webhook already admits only a consistent reference (``cdi.webhooks.validation``
step 7: no namespace, ``dataSource`` and ``dataSourceRef`` equal, required fields).

CDI also refuses when the class's provisioner is not a CSI driver
(``NoCSIDriverForExternalPopulation``) and when the API server lacks the AnyVolumeDataSource
gate (GA and always on since Kubernetes 1.33, so not checked here).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from cdi.api.constants import Phase
from cdi.api.types import ClaimSpec, DataVolume
from cdi.controller.flavours import JSON, Claim, FlavourDefaults, FlavourDeps, PhaseEvent
from cdi.controller.record import OUTCOME_SUCCEEDED, ClaimRecord
from cdi.controller.status import ClaimProblem, FlavourPhases, View
from cdi.kube.client import PVCS
from cdi.kube.events import NORMAL, WARNING
from cdi.kube.workqueue import Result

POLL = 2.0
REASON_SUCCEEDED = "ExternalPopulationSucceeded"
REASON_NO_CSI_DRIVER = "NoCSIDriverForExternalPopulation"
EXTERNAL_PHASES = FlavourPhases(
    scheduled=Phase.PENDING,
    in_progress=Phase.PENDING,
    worker="External populator",
    activity="External population",
)
EXTERNAL_EVENTS: Mapping[str, PhaseEvent] = {
    Phase.SUCCEEDED: PhaseEvent(
        NORMAL, REASON_SUCCEEDED, "PVC {claim} successfully populated by an external populator"
    ),
}
POPULATED = ClaimRecord(
    outcome=OUTCOME_SUCCEEDED, reason="Completed", message="External population succeeded"
)
BUILTIN_REFERENCES = {("", "PersistentVolumeClaim"), ("snapshot.storage.k8s.io", "VolumeSnapshot")}


def claim_spec(dv: DataVolume) -> ClaimSpec | None:
    return dv.spec.storage or dv.spec.pvc


def is_external(dv: DataVolume) -> bool:
    """No source of ours, and the claim spec names what fills it."""
    spec = claim_spec(dv)
    if dv.spec.source is not None or dv.spec.source_ref is not None or spec is None:
        return False
    return spec.data_source_ref is not None or spec.data_source is not None


def with_reference(desired: JSON, dv: DataVolume) -> JSON:
    """The rendered claim with the DataVolume's ``dataSource``/``dataSourceRef`` (each given
    one stands for both, as the API server defaults them)."""
    spec = claim_spec(dv)
    assert spec is not None
    ref = spec.data_source_ref or spec.data_source
    assert ref is not None
    out = copy.deepcopy(desired)
    body: dict[str, Any] = {"kind": ref.kind, "name": ref.name}
    if ref.api_group:
        body["apiGroup"] = ref.api_group
    out["spec"]["dataSourceRef"] = dict(body)
    out["spec"]["dataSource"] = dict(body)
    return out


class ExternalFlavour(FlavourDefaults):
    """Create the claim with its reference; report it populated once bound."""

    phases = EXTERNAL_PHASES
    events = EXTERNAL_EVENTS
    fills_unbound = True

    def __init__(self, deps: FlavourDeps) -> None:
        self.deps = deps

    async def before_claim(
        self, dv: DataVolume, obj: Mapping[str, Any], desired: JSON, view: View
    ) -> tuple[JSON | None, View, Result]:
        problem = self._driver_problem(dv, desired)
        if problem is not None:
            await self.deps.events.emit(dict(obj), WARNING, REASON_NO_CSI_DRIVER, problem)
            view = dataclasses.replace(view, problem=ClaimProblem(REASON_NO_CSI_DRIVER, problem))
            return None, view, Result(requeue_after=30.0)
        return with_reference(desired, dv), view, Result()

    def _driver_problem(self, dv: DataVolume, desired: JSON) -> str | None:
        """CDI's refusal of a foreign reference on a class whose provisioner is in-tree (it
        cannot hand the claim to a populator). A PVC or VolumeSnapshot reference is the
        provisioner's own business; a class not cached yet is not judged."""
        spec = claim_spec(dv)
        ref = (spec.data_source_ref or spec.data_source) if spec else None
        if ref is None or (ref.api_group or "", ref.kind) in BUILTIN_REFERENCES:
            return None
        name = str((desired.get("spec") or {}).get("storageClassName") or "")
        found = self.deps.storage_class(name) if name else None
        provisioner = str((found or {}).get("provisioner") or "")
        if provisioner.startswith("kubernetes.io/"):
            return f"The storage class {name} uses the in-tree provisioner {provisioner}"
        return None

    async def sync(self, claim: Claim, view: View) -> tuple[View, Result]:
        pvc = claim.pvc
        if (pvc.get("status") or {}).get("phase") != "Bound":
            phase = Phase.PENDING_POPULATION if view.waiting_for_consumer else Phase.PENDING
            view = dataclasses.replace(view, step=phase, pvc_phase=view.pvc_phase or "Pending")
            return view, Result(requeue_after=POLL)
        record = dataclasses.replace(POPULATED, failed_attempts=claim.record.failed_attempts)
        if record.differs_from(pvc):
            meta = pvc["metadata"]
            patch = {"metadata": {"annotations": record.annotations()}}
            written = await self.deps.kube.patch(PVCS, meta["name"], patch, meta.get("namespace"))
            self.deps.claims.wrote(written)
        return dataclasses.replace(view, record=record), Result()

    async def finish(self, claim: Claim) -> None:
        return None
